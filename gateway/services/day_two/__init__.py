"""Day two: drift records, revert and codify, imports, rollbacks, break-glass windows, the simulator."""
