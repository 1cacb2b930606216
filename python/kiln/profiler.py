"""kiln.profiler: MXNet's profiler API over kiln's recorder; the trace opens in Perfetto or chrome://tracing.

    from kiln import profiler
    profiler.set_config(profile_all=True, filename='trace.json', aggregate_stats=True)
    profiler.set_state('run')
    ...                                   # eager ops, hybridized calls, collectives
    kiln.waitall()                        # queued work is recorded when it has run
    profiler.set_state('stop')
    print(profiler.dumps())               # per op: count, total, min, max, mean
    profiler.dump()                       # writes trace.json (Chrome trace-event JSON)

The trace has one lane per engine worker and per GPU stream (host side, and the stream's own
device time measured by events on it); every engine task carries its op name and, in
args.queued_us, the time it waited between being queued and starting. A compiled call's steps are
nested inside its event; collectives carry their byte counts; compilation shows as trace, pass,
plan and kernel-cache events; memory in use per device is a counter. KILN_PROFILE=trace.json
profiles a whole run without any code and writes the trace at exit.

set_config's switches select what is recorded, as MXNet's do: profile_imperative (engine tasks:
eager ops and compiled calls as queued work), profile_symbolic (a compiled call's steps),
profile_memory (memory counters), profile_api (compilation and collectives), profile_all (all of
them). continuous_dump is accepted: every dump writes all the events recorded so far.

What it does not do: MXNet's Domain/Task/Frame/Marker objects, dumping on a timer, call stacks.
"""
import os

from . import _C
from ._C import ArgumentError, StateError

_P = _C._profiler

__all__ = ["set_config", "set_state", "state", "pause", "resume", "dump", "dumps"]

_SWITCHES = ("profile_all", "profile_symbolic", "profile_imperative", "profile_memory", "profile_api",
             "continuous_dump", "aggregate_stats")
_config = {"profile_all": False, "profile_symbolic": True, "profile_imperative": True,
           "profile_memory": True, "profile_api": True, "continuous_dump": False,
           "aggregate_stats": False, "filename": "profile.json"}
_state = {"run": False, "paused": False}


def _mask():
    c = _config
    if c["profile_all"]:
        return _P.ALL
    m = 0
    if c["profile_imperative"]:
        m |= _P.OPERATOR | _P.GPU
    if c["profile_symbolic"]:
        m |= _P.SYMBOLIC | _P.GPU
    if c["profile_memory"]:
        m |= _P.MEMORY
    if c["profile_api"]:
        m |= _P.COMPILE | _P.COLLECTIVE
    return m


def _check_filename(filename):
    if not isinstance(filename, (str, os.PathLike)):
        raise ArgumentError(f"profiler.set_config: filename must be a path (str), got {type(filename).__name__}")
    filename = os.fspath(filename)
    directory = os.path.dirname(os.path.abspath(filename))
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise ArgumentError(f"profiler.set_config: cannot write the trace to {filename!r}: expected a file name "
                            f"in an existing, writable directory ({directory!r} is not one)")
    if os.path.isdir(filename):
        raise ArgumentError(f"profiler.set_config: filename {filename!r} is a directory; expected a file name")
    return filename


def set_config(**kwargs):
    """Sets what the profiler records and where dump() writes (MXNet's keyword names).

    profile_all, profile_symbolic, profile_imperative, profile_memory, profile_api, continuous_dump,
    aggregate_stats: booleans; filename: the trace file of dump(). Unknown names raise
    ArgumentError. While running, the new selection applies at once."""
    for key, value in kwargs.items():
        if key == "filename":
            _check_filename(value)
        elif key in _SWITCHES:
            if not isinstance(value, (bool, int)):
                raise ArgumentError(f"profiler.set_config: {key} must be True or False, got {value!r}")
        else:
            known = ", ".join(_SWITCHES + ("filename",))
            raise ArgumentError(f"profiler.set_config: unknown option {key!r}; expected one of {known}")
    for key, value in kwargs.items():
        _config[key] = os.fspath(value) if key == "filename" else bool(value)
    if _state["run"] and not _state["paused"]:
        _P.set_recording(_mask())


def set_state(state="stop"):
    """'run' starts recording, 'stop' stops it (the events so far are kept for dump and dumps)."""
    if state not in ("run", "stop"):
        raise ArgumentError(f"profiler.set_state: expected 'run' or 'stop', got {state!r}")
    _state["run"] = state == "run"
    _state["paused"] = False
    _P.set_recording(_mask() if _state["run"] else 0)


def state():
    """'run' while recording (even paused), else 'stop'."""
    return "run" if _state["run"] else "stop"


def pause():
    """Stops recording until resume(), without leaving the 'run' state."""
    if _state["run"]:
        _state["paused"] = True
        _P.set_recording(0)


def resume():
    """Records again after pause()."""
    if _state["run"] and _state["paused"]:
        _state["paused"] = False
        _P.set_recording(_mask())


def dump(finished=True):
    """Writes every event recorded so far to set_config's filename (atomically: a temporary file,
    then rename). Work still queued is recorded when it has run: call kiln.waitall() first.
    finished=True also stops the profiler and forgets the events (as MXNet's last dump): the next
    dump's trace starts afresh. Their aggregate statistics stay: dumps() reports them until
    dumps(reset=True), as MXNet's."""
    _P.write_trace(_config["filename"])
    if finished:
        set_state("stop")
        # With aggregate statistics on, the events' statistics are kept for dumps() (folding them
        # costs a pass over the events; without, there is no dumps() to keep them for).
        if _config["aggregate_stats"]:
            _P.clear_trace()
        else:
            _P.clear()


def dumps(reset=False):
    """The aggregate statistics as a table, one section per kind (operator, symbolic, compile,
    collective, gpu, Device Storage) and one row per name: count, total, min, max and mean time
    in milliseconds (kilobytes in use for memory), as MXNet prints them: every event since the
    last reset, those of traces dump(finished=True) wrote included. reset=True forgets the
    statistics afterwards, and with them the events not yet dumped (kiln keeps one store of events:
    a later dump()'s trace starts at the reset). Needs set_config(aggregate_stats=True), as in MXNet."""
    if not _config["aggregate_stats"]:
        raise StateError("profiler.dumps: aggregate statistics are off; call "
                         "profiler.set_config(aggregate_stats=True) before profiling")
    table = _P.aggregate_table()
    if reset:
        _P.clear()
    return table
