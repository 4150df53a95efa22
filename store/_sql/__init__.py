"""The event log in SQL: every module here is a function over one open transaction or a DB-API cursor.

Nothing here is public. The faces (`store.Store`, `store.Ledger` and their
async twins) build `Op`s from these functions (`store._ops`) and run them
(`store._db.run`, or the faces' own tiers over `store._sql.ops`); what holds
database resources (engines, driver connections, replicas, the tail's
notifier and waiters) is `store._db`'s. docs/architecture.md says which
module owns what.
"""
