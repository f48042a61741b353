"""Which launcher started this process, and who this rank is: environment variables -> a Launch.

Runs in every pytest process that loads the plugin (not in pool mode's ranks), at configure time:
plugin.py's gate asks it whether this process is a rank of a launched world (torchrun, srun,
mpirun) before it starts anything else, and imports nothing heavy (no torch), so that asking
costs an ordinary session nothing. :func:`detect` is pure logic over an environment mapping,
unit-tested on plain dicts; :func:`launch_of` applies it to this process.

Rules. torchrun's variables win over Slurm's, Slurm's over MPI's (torchrun under srun is common,
and srun under an MPI-aware Slurm sets PMI variables too). ``auto`` needs the launcher's own
variables: torchrun's ``RANK`` and ``WORLD_SIZE``; an srun step's ``SLURM_PROCID``,
``SLURM_NTASKS`` and ``SLURM_STEP_ID`` (an sbatch script itself has no step id, and a pytest run
there directly is not a launched world); Open MPI's ``OMPI_COMM_WORLD_RANK`` and
``OMPI_COMM_WORLD_SIZE``, or MPICH/Intel MPI's ``PMI_RANK`` and ``PMI_SIZE``. Rendezvous is always
at ``MASTER_ADDR:MASTER_PORT``: torchrun sets them; under Slurm and MPI the user does.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Mapping

import pytest

from ..envvars import RANK_ENV

LAUNCHER_NAMES = ("torchrun", "slurm", "mpi")
#: The name users read for each launcher, in messages.
TITLES = {"torchrun": "torchrun", "slurm": "Slurm (srun)", "mpi": "MPI (mpirun)"}

SLURM_HINT = (
    "In the sbatch script, before srun:\n"
    '    export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)\n'
    "    export MASTER_PORT=29500   # any free port on that host"
)
MPI_HINT = (
    "Set them in the environment mpirun passes on, e.g.:\n"
    "    mpirun -np 4 -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500 "
    "python -m pytest -p distrank ...\n"
    "(Open MPI's -x; MPICH and Intel MPI take -genv MASTER_ADDR <host> -genv MASTER_PORT 29500)"
)
TORCHRUN_HINT = (
    "torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for every process "
    "it starts; a hand-made env:// world must set all five"
)


class LaunchError(Exception):
    """The environment says "launched", but something needed is missing or malformed."""


@dataclasses.dataclass(frozen=True)
class Launch:
    """This pytest process as one rank of a launched world."""

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    #: Ranks on this machine, when the launcher says (torchrun, Open MPI, MPICH).
    local_world_size: int | None
    master_addr: str
    master_port: int
    #: torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT; otherwise rank 0 hosts it.
    agent_store: bool
    #: torchrun's restart count: keys of an earlier attempt in the agent's store are not reused.
    restart: int
    #: The variables the rank, world size and local rank came from, in order.
    variables: tuple[str, ...]
    #: Nodes (machines) of the world, when the launcher says.
    nodes: int | None = None
    #: How the launcher mode was chosen, e.g. "--distrank-launcher auto (default)".
    chosen: str = ""

    @property
    def title(self) -> str:
        return TITLES[self.launcher]

    @property
    def one_node(self) -> bool:
        """Every rank runs on this machine, as far as the launcher says (its local world is the
        whole world, or it counts one node)."""
        return self.local_world_size == self.world_size or self.nodes == 1

    def label(self) -> str:
        """``rank 3/4 (torchrun)``: who this process is, for one-line messages."""
        return f"rank {self.rank}/{self.world_size} ({self.launcher})"

    def describe(self) -> str:
        """The header's account: launcher, the variables it was detected from, the world."""
        nodes = f" on {self.nodes} nodes" if self.nodes and self.nodes > 1 else ""
        return (
            f"launcher {self.launcher} (from {', '.join(self.variables)}; {self.chosen}), "
            f"world size {self.world_size}{nodes}"
        )

    def rank_env(self) -> dict[str, str]:
        """torchrun's variables for code under test that reads them (set where missing)."""
        env = {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }
        if self.local_world_size is not None:
            env["LOCAL_WORLD_SIZE"] = str(self.local_world_size)
        return env


@dataclasses.dataclass(frozen=True)
class _Scheme:
    name: str
    rank: str
    size: str
    local_rank: str
    local_size: str | None
    #: Also needed before ``auto`` believes it (see the module docstring).
    marker: str | None = None


_SCHEMES: dict[str, tuple[_Scheme, ...]] = {
    "torchrun": (_Scheme("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),),
    "slurm": (
        _Scheme(
            "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None, marker="SLURM_STEP_ID"
        ),
    ),
    "mpi": (
        _Scheme(
            "mpi",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
        _Scheme("mpi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ),
}


def _present(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip() != ""


def _scheme_of(env: Mapping[str, str], launcher: str, auto: bool) -> _Scheme | None:
    for scheme in _SCHEMES[launcher]:
        needed = [scheme.rank, scheme.size]
        if auto and scheme.marker:
            needed.append(scheme.marker)
        if all(_present(env, name) for name in needed):
            return scheme
    return None


def _int(env: Mapping[str, str], name: str, launcher: str, minimum: int) -> int:
    raw = env.get(name, "")
    try:
        value = int(raw.strip())
    except ValueError:
        raise LaunchError(
            f"pytest-distrank: {TITLES[launcher]} launch, but {name}={raw!r} is not an integer."
        ) from None
    if value < minimum:
        raise LaunchError(
            f"pytest-distrank: {TITLES[launcher]} launch, but {name}={raw!r} is below {minimum}."
        )
    return value


def _missing_hint(launcher: str) -> str:
    return {"slurm": SLURM_HINT, "mpi": MPI_HINT}.get(launcher, TORCHRUN_HINT)


def _rendezvous(env: Mapping[str, str], launcher: str, who: str) -> tuple[str, int]:
    missing = [n for n in ("MASTER_ADDR", "MASTER_PORT") if not _present(env, n)]
    if missing:
        names = " and ".join(missing)
        verb = "are" if len(missing) > 1 else "is"
        raise LaunchError(
            f"pytest-distrank: launched by {TITLES[launcher]} ({who}), but {names} {verb} not "
            "set.\nThe ranks meet at MASTER_ADDR:MASTER_PORT: a TCP store on the host of rank 0 "
            f"(or torchrun's own store).\n{_missing_hint(launcher)}\n"
            "Or run this process as a plain pytest session: --distrank-launcher=off."
        )
    port = _int(env, "MASTER_PORT", launcher, 1)
    if port > 65535:
        raise LaunchError(
            f"pytest-distrank: {TITLES[launcher]} launch, but MASTER_PORT={port} is not a port "
            "(1-65535)."
        )
    return env["MASTER_ADDR"].strip(), port


def _nodes(env: Mapping[str, str], launcher: str) -> int | None:
    names = {
        "torchrun": ("GROUP_WORLD_SIZE",),
        "slurm": ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
        "mpi": (),
    }[launcher]
    for name in names:
        raw = env.get(name, "").strip()
        if raw.isdigit() and int(raw) > 0:
            return int(raw)
    return None


def _build(env: Mapping[str, str], scheme: _Scheme, chosen: str) -> Launch:
    launcher = scheme.name
    rank = _int(env, scheme.rank, launcher, 0)
    size = _int(env, scheme.size, launcher, 1)
    who = f"{scheme.rank}={rank}, {scheme.size}={size}"
    if rank >= size:
        raise LaunchError(
            f"pytest-distrank: {TITLES[launcher]} launch, but {who}: the rank must be below the "
            "world size."
        )
    if not _present(env, scheme.local_rank):
        hint = (
            _missing_hint(launcher)
            if launcher == "torchrun"
            else f"Is this process really started by {TITLES[launcher]}?"
        )
        raise LaunchError(
            f"pytest-distrank: launched by {TITLES[launcher]} ({who}), but {scheme.local_rank} "
            f"(this rank's index on its machine) is not set. {hint}"
        )
    local_rank = _int(env, scheme.local_rank, launcher, 0)
    local_size = None
    if scheme.local_size and _present(env, scheme.local_size):
        local_size = _int(env, scheme.local_size, launcher, 1)
    addr, port = _rendezvous(env, launcher, who)
    agent_store = launcher == "torchrun" and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    restart_raw = env.get("TORCHELASTIC_RESTART_COUNT", "0") if launcher == "torchrun" else "0"
    restart = int(restart_raw) if restart_raw.strip().isdigit() else 0
    variables = [scheme.rank, scheme.size, scheme.local_rank, "MASTER_ADDR", "MASTER_PORT"]
    return Launch(
        launcher=launcher,
        rank=rank,
        world_size=size,
        local_rank=local_rank,
        local_world_size=local_size,
        master_addr=addr,
        master_port=port,
        agent_store=agent_store,
        restart=restart,
        variables=tuple(variables),
        nodes=_nodes(env, launcher),
        chosen=chosen,
    )


def detect(
    env: Mapping[str, str], requested: str = "auto", source: str = "default"
) -> Launch | None:
    """The launched world this process belongs to, or None for an ordinary pytest session.

    ``requested`` is the ``--distrank-launcher`` value and ``source`` where it came from. Raises
    :class:`LaunchError` when the environment says "launched" but cannot be used, or when a
    launcher was asked for by name and its variables are missing.
    """
    chosen = f"--distrank-launcher {requested} ({source})"
    if requested == "off":
        return None
    if requested == "auto":
        if _present(env, RANK_ENV):
            # RANK, MASTER_ADDR... were set by pytest-distrank's own pool mode for one of its
            # rank processes: a pytest started from a test in there is not a launched rank.
            return None
        for launcher in LAUNCHER_NAMES:
            scheme = _scheme_of(env, launcher, auto=True)
            if scheme is not None:
                if env[scheme.size].strip() == "1":
                    # One process (``srun -n1 pytest``, a CI job on a Slurm node): nothing to
                    # run in lock-step with; pool mode starts pools of any size.
                    return None
                return _build(env, scheme, chosen)
        return None
    if requested not in LAUNCHER_NAMES:
        raise LaunchError(
            f"pytest-distrank: unknown launcher {requested!r} ({source}); expected one of "
            f"auto, off, {', '.join(LAUNCHER_NAMES)}."
        )
    scheme = _scheme_of(env, requested, auto=False)
    if scheme is None:
        wanted = " and ".join(f"{s.rank}/{s.size}" for s in _SCHEMES[requested])
        raise LaunchError(
            f"pytest-distrank: {chosen} asks for a {TITLES[requested]} launch, but {wanted} "
            f"are not set: this process was not started by {TITLES[requested]}.\n"
            f"Start pytest through it (e.g. {_example(requested)}), or use "
            "--distrank-launcher=auto."
        )
    return _build(env, scheme, chosen)


def launch_of(config: pytest.Config, early: bool = False) -> Launch | None:
    """:func:`detect` for this process, with ``--distrank-launcher`` resolved (UsageError;
    ``early``: see :func:`settings.resolve`)."""
    from ..options import LAUNCHER
    from ..settings import resolve

    choice = resolve(config, LAUNCHER, early)
    try:
        return detect(os.environ, choice.value, choice.source)
    except LaunchError as exc:
        raise pytest.UsageError(str(exc)) from None


def _example(launcher: str) -> str:
    return {
        "torchrun": "torchrun --nproc-per-node=2 -m pytest -p distrank",
        "slurm": "srun --ntasks=4 python -m pytest -p distrank",
        "mpi": "mpirun -np 4 python -m pytest -p distrank",
    }[launcher]


def rerun_command(launch: Launch, nodeid: str, seed: int | None = None) -> str:
    """A command line that reruns one test in a world of the same size (and session seed)."""
    ws = launch.world_size
    test = f"-p distrank {'' if seed is None else f'--distrank-seed={seed} '}{shlex.quote(nodeid)}"
    if launch.launcher == "slurm":
        return f"srun --ntasks={ws} python -m pytest {test}"
    if launch.launcher == "mpi":
        return f"mpirun -np {ws} python -m pytest {test}"
    if launch.nodes and launch.nodes > 1:
        per_node = launch.local_world_size or max(1, ws // launch.nodes)
        return (
            f"torchrun --nnodes={launch.nodes} --nproc-per-node={per_node} --rdzv-backend=c10d "
            f"--rdzv-endpoint=<host>:<port> -m pytest {test}   (on every node)"
        )
    return f"torchrun --nproc-per-node={ws} -m pytest {test}"
