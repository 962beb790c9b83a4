"""What runs confined: the code of a process where generated env code executes.

``runtime`` compiles an env's code once and serves isolated SQLite instances of it, guarded
in-process (``_guard``, ``_confine``, ``_sqlite_guard``, ``_binding``); ``jail`` is the kernel's
part (Landlock, seccomp, its own uid), entered by the process itself; ``env_worker`` is an env
worker's main (``python -m envfarm.confined CONFIG``), speaking ``frames`` to the front.
The front's handles on these processes are ``envfarm.worker``.

Nothing is imported here: the verifier zygote loads ``envfarm.confined.jail`` alone.
"""
