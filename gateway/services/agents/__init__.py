"""Agents: the built-in agent's requests and turns, external agents over MCP, the circuit breaker."""
