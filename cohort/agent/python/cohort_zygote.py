"""cohort's warm interpreter: the agent starts this once per node for a Python entrypoint.

It imports what the workers will need (torch, and what `cohort run --preload` names) before
they are needed, then forks each worker of every attempt from itself, the way Python's
forkserver does, so that a restart skips the interpreter start and the torch import.

Protocol, over the SOCK_SEQPACKET socket whose descriptor is in COHORT_ZYGOTE_FD:
  zygote -> agent, once: {"ready": true} or {"error": "..."} (then it exits 3)
  agent -> zygote, per worker: {"argv": [...], "env": ["K=V", ...], "cwd": "...",
      "module": bool, "agent": pid} with three descriptors: stdin, stdout, stderr
  worker -> agent: {"pid": N} once it is the agent's child (the agent is a subreaper; the
      zygote double-forks), or {"error": "..."}
EOF on the socket: the zygote exits.

The worker must not be able to tell it was forked: it gets its own session leader status as
a fresh worker gets its process group, the agent as parent, its environment (os.environ and
the C environment), working directory, sys.argv, sys.path[0], a fresh __main__, default
signal handling, fresh seeds for random (and numpy), and exits as the interpreter would
(SystemExit codes, tracebacks, KeyboardInterrupt as SIGINT, atexit handlers). One
difference, on purpose: after an uncaught exception the worker prints the traceback, runs
the atexit handlers and flushes every open file, then exits 1 without tearing down its
modules (torch's teardown takes 0.3 s, more on a loaded host, and the agent restarts the
group only once the failed worker is gone).
"""
import os
import sys

PR_SET_PDEATHSIG = 1


def _send(sock, obj, fds=()):
    import json
    import socket
    data = json.dumps(obj).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def _become_worker(sock, req, fds):
    """Runs in the grandchild: turn into the worker and run its program; never returns."""
    import ctypes
    import signal
    import time
    os.setpgid(0, 0)
    agent = req["agent"]
    # The intermediate has exited or is exiting: wait until the agent (a subreaper) is our
    # parent, then die with it as a worker the agent spawned itself would.
    deadline = time.monotonic() + 5
    while os.getppid() != agent and time.monotonic() < deadline:
        time.sleep(0.0002)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != agent:
        _send(sock, {"error": "the worker was not adopted by the agent (is it a subreaper?)"})
        os._exit(1)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    _send(sock, {"pid": os.getpid()})
    sock.close()

    # The state a fresh interpreter would have.
    for sig in range(1, signal.NSIG):
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            if sig == signal.SIGINT:
                signal.signal(sig, signal.default_int_handler)
            elif sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_IGN)  # as Python sets them at start-up
            else:
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    os.chdir(req["cwd"])
    os.environ.clear()
    for entry in req["env"]:
        key, _, value = entry.partition("=")
        if key:
            os.environ[key] = value
    import random
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    sys.argv = list(req["argv"])
    sys.orig_argv = list(req["orig_argv"])
    code = _run_main(req)
    if code is _FAILED:
        _exit_after_failure()
    sys.exit(code)


_FAILED = object()  # _run_main's result after an uncaught exception


def _exit_after_failure():
    """Exit status 1 as the interpreter gives it after an uncaught exception, keeping what its
    exit keeps (atexit handlers, buffered writes of files still open) without the teardown
    of every module. Never returns."""
    import atexit
    import gc
    import io
    try:
        atexit._run_exitfuncs()
    finally:
        for std in (sys.stdout, sys.stderr):  # made before the fork: frozen, not listed below
            try:
                std.flush()
            except Exception:  # noqa: B902 - a closed or broken stream
                pass
        for obj in gc.get_objects():
            # type(), not isinstance(): that would ask objects that answer every attribute
            # (torch's deprecated reduce_op warns) for their __class__.
            if issubclass(type(obj), io.IOBase):
                try:
                    if not obj.closed:
                        obj.flush()
                except Exception:  # noqa: B902 - a file that cannot flush loses nothing more
                    pass
        os._exit(1)


def _run_main(req):
    """Runs the script (or module) as __main__; returns the exit status, or _FAILED after an
    uncaught exception (its traceback printed), or raises SystemExit."""
    import builtins
    import runpy
    import signal
    import traceback
    import types
    argv0 = req["argv"][0]
    try:
        if req["module"]:
            sys.path[0] = os.getcwd()
            runpy.run_module(argv0, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.realpath(argv0))
            main = types.ModuleType("__main__")
            main.__file__ = argv0
            main.__builtins__ = builtins
            main.__cached__ = None
            main.__package__ = None
            main.__spec__ = None
            from importlib.machinery import SourceFileLoader
            main.__loader__ = SourceFileLoader("__main__", argv0)
            sys.modules["__main__"] = main
            with open(argv0, "rb") as f:
                source = f.read()
            exec(compile(source, argv0, "exec"), main.__dict__)
        return 0
    except SystemExit:
        raise
    except BaseException as e:  # noqa: B902 - an uncaught exception of the user's program
        tb = e.__traceback__
        # Show the traceback from the user's code down, as a fresh interpreter would.
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        if isinstance(e, KeyboardInterrupt):
            sys.stdout.flush()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            return 1
        return _FAILED


def main():
    import importlib
    import json
    import socket
    sock = socket.socket(fileno=int(os.environ.pop("COHORT_ZYGOTE_FD")))
    modules = [m for m in sys.argv[1:] if m]
    try:
        for name in modules:
            importlib.import_module(name)
    except BaseException as e:  # noqa: B902 - any failure means: start workers fresh
        _send(sock, {"error": f"import {name} failed: {type(e).__name__}: {e}"})
        return 3
    sys.stdout.flush()
    sys.stderr.flush()
    # What was imported here is never collected in a worker: without this, every full
    # collection in a worker walks torch's objects and writes to their pages, which copies
    # them from this process (a gc.collect() took 0.48 s instead of 0.03 s).
    import gc
    gc.freeze()
    _send(sock, {"ready": True})
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        except InterruptedError:
            continue
        if not msg:
            return 0
        req = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            try:
                if os.fork() == 0:
                    try:
                        _become_worker(sock, req, fds)
                    except SystemExit:
                        raise
                    except BaseException as e:  # noqa: B902
                        try:
                            _send(sock, {"error": f"{type(e).__name__}: {e}"})
                        finally:
                            os._exit(1)
            except SystemExit:
                raise
            except BaseException:  # noqa: B902
                os._exit(1)
            else:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    sys.exit(main())
