# The README's two commands, for machines with make (a fresh Debian has none: scripts/demo and
# scripts/test are the same commands without it).
.PHONY: demo test setup
ARGS ?=

demo:  ## install what is missing, then watch pitcrew heal a GPU fault (make demo ARGS="--scenario storm")
	scripts/demo $(ARGS)

test:  ## install what is missing, then the whole test suite against the real servers
	scripts/test $(ARGS)

setup:  ## install only (Debian packages, .venv with pitcrew[dev])
	scripts/setup dev
