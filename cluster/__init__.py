"""Putting the farm together and running it: the composition root, above everything it composes.

``cluster.compose`` hands the judge to the farm; ``cluster.serve`` is the Ray Serve shell (the
only Ray in the farm); ``cluster.cli`` is the ``envfarm`` command line, with each package's
commands; ``cluster.local_cluster`` starts a multi-node Ray cluster on one machine.
Nothing below this folder imports it.
"""
