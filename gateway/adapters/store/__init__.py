"""The records in SQL (SQLite or PostgreSQL): a unit of work with one repository per aggregate.

unit_of_work.py   SqlStore (units of work, locks, queue, workers) and SqlUnitOfWork
principals.py     people, agents, linked GitHub accounts
proposals.py      proposals, plans, decisions, overrides, applies
conversations.py  the agent's conversations and runs
jobs.py           jobs in a use case's transaction, and the queue workers claim from
locks.py          stack locks
workers.py        the worker registry (who runs, by their beats)
github.py         webhook deliveries, pull requests
main_branch.py    main as last seen, pushes made outside the gateway
day_two.py        drift records, break-glass windows
breaker.py        the circuit breaker
audit.py          the hash-chained trail and its checkpoints
rows.py           row conversions, the clock
"""
