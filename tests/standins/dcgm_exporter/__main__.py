"""``python -m tests.standins.dcgm_exporter`` is ``python -m bot.demo.dcgm``."""

from bot.demo.dcgm.__main__ import main

if __name__ == "__main__":
    main()
