"""Pool mode, controller side: the pools (the middle room; imports ``onetest/``, not the session).

``poolset`` (every pool of the session by key, the fork server, start-up bounds), ``pool`` (one
pool's processes: start, send a test, apply its verdict, stop), ``poolkey``, ``stats``,
``forkserver``, ``preloads``, ``cmdline`` (a rank's command line, coverage), and the GPU
leases: ``gpus``, ``lockfolder``, ``gpumemory``.
"""
