"""The env runtime in one process: reset, a tool call's overhead, the guard, the SQLite fence."""
