"""Re-export: ``python -m tests.simulator.serve`` is ``python -m bot.demo.simulator.serve``."""

from bot.demo.simulator.serve import WorldFile, load_world, main, simulated_ports

__all__ = ["WorldFile", "load_world", "main", "simulated_ports"]

if __name__ == "__main__":
    raise SystemExit(main())
