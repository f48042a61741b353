"""A test's process tree as part of its report (docs/own-workers.md).

Modules: ``options`` (the marker, ``--distrank-process-tree`` and its seams), ``procs`` (the tree
read from /proc, its watch during a test, its end), ``dump`` (the Python stacks of its processes:
py-spy, or faulthandler where py-spy is missing or refused), ``words`` (the report's text and
the verdict on deaths), ``plugin`` (the hooks: ordinary tests in the controller, distributed
tests in their ranks) and ``pooldeadline`` (the stacks of a stuck rank's tree, in the controller).
"""
