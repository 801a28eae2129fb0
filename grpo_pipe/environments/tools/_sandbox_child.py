"""The child side of the `python` tool's sandbox: run as `python -I -c <this file's text> CONFIG_JSON` (never imported).

Order matters: namespaces (needs ctypes), then rlimits, then the audit hook, then the snippet. The hook binds every
name it reads as a default argument, so a snippet that patches `os`, `builtins` or `posix` cannot change its checks.
"""
# ruff: noqa  # deliberate: one-line imports, bound defaults (B008) and late binding are the hardening, not slips

import builtins, itertools, json, linecache, os, posix, resource, signal, stat, sys, sysconfig, traceback, types

CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWPID = 0x10000000, 0x40000000, 0x20000000
PR_SET_PDEATHSIG = 1
AF_UNIX = 1
DENIED_MODULES = frozenset({  # C modules that start processes, reach raw memory, or do I/O with no audit event
    "_posixsubprocess", "_ctypes", "_ctypes_test", "_xxsubinterpreters", "_xxinterpchannels", "_testcapi",
    "_testinternalcapi", "_testmultiphase", "_testbuffer", "_testimportmultiple", "_testsinglephase", "_xxtestfuzz",
    "_posixshmem", "_dbm", "_gdbm", "_ssl", "_curses", "_curses_panel", "_tkinter", "readline", "pwd", "grp", "spwd", "nis",
})
DENIED = (  # (reason, events or event prefixes)
    ("starting processes", ("os.system", "os.exec", "os.posix_spawn", "subprocess.Popen")),
    ("signalling processes", ("os.kill", "os.killpg")),
    ("symbolic links", ("os.symlink",)),
    ("changing resource limits", ("resource.setrlimit", "resource.prlimit")),
    ("tracing and introspection", ("sys.settrace", "sys.setprofile", "sys._current_frames", "gc.get_referrers",
                                   "gc.get_objects", "gc.get_referents")),
    ("sub-interpreters", ("cpython.PyInterpreterState_New",)),
    ("network access", ("socket.",)), ("ctypes", ("ctypes.",)), ("syslog", ("syslog.",)), ("sqlite", ("sqlite3.",)),
)
# Raised in C after the path was converted to str or bytes (shutil, glob and tempfile raise events of their own with
# whatever object they were given, but each file operation they make raises one of these or "open").
READ_EVENTS = frozenset({"os.listdir", "os.scandir", "os.getxattr", "os.listxattr"})
WRITE_EVENTS = frozenset({"os.chmod", "os.chown", "os.chflags", "os.lchflags", "os.mkdir", "os.remove", "os.rmdir",
                          "os.truncate", "os.utime", "os.setxattr", "os.removexattr", "os.rename", "os.link"})
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"})


def enter_namespaces(parent_pid):
    """New user, network and pid namespaces, where the kernel allows it; ctypes is gone from sys.modules after.

    And the kernel's parent-death signal, so a job killed outright (SIGKILL: nothing of it runs to kill us) takes
    its sandbox with it. Isolated, the signal goes to the namespace's waiter (SIGTERM: it kills the namespace's
    first process, and with it every process in there); otherwise to the snippet's own process (SIGKILL, which a
    snippet cannot ignore: it can change signal handlers, not this)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        entered = libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID) == 0
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM if entered else signal.SIGKILL)
    except (ImportError, OSError, AttributeError):
        entered = False
    for name in [n for n in sys.modules if n in ("ctypes", "_ctypes") or n.startswith("ctypes.")]:
        del sys.modules[name]
    if os.getppid() != parent_pid:  # the job died before the signal was armed
        os._exit(1)
    return entered


def become_namespace_init(alarm_s):
    """Fork the pid namespace's first process, which returns and runs the snippet; this one waits, then exits alike."""
    child = os.fork()
    if child == 0:
        return
    # If the parent dies without killing us, nothing else bounds a snippet that sleeps: the alarm, and the
    # parent-death signal (SIGTERM here, armed in enter_namespaces) when the job itself was killed.
    signal.signal(signal.SIGALRM, lambda *_: os.kill(child, signal.SIGKILL))
    signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGKILL))
    signal.alarm(alarm_s)
    status = os.waitpid(child, 0)[1]
    if os.WIFSIGNALED(status):
        if os.WTERMSIG(status) != signal.SIGKILL:
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


def set_limits(config):
    """soft == hard, so the snippet cannot raise them (and the CPU limit is a SIGKILL it cannot catch)."""
    for limit, value in ((resource.RLIMIT_CPU, config["cpu_s"]), (resource.RLIMIT_AS, config["memory_bytes"]),
                         (resource.RLIMIT_FSIZE, config["file_bytes"]), (resource.RLIMIT_CORE, 0)):
        hard = resource.getrlimit(limit)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (value, value))


def read_roots():
    """The Python installation's stdlib and site-packages, symlinks resolved: what imports need to read."""
    paths = sysconfig.get_paths()
    prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    found = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    found += [p for p in sys.path if os.path.isabs(p) and os.path.isdir(p) and p.startswith(prefixes)]
    return tuple(sorted({os.path.realpath(p) for p in found}))


def make_hook(workdir, roots, fork_budget):
    """The audit hook. Every name it uses is a parameter default bound now, before any snippet code runs."""

    def to_text(obj, _type=type, _str=str, _bytes=bytes, _int=int, _issubclass=issubclass,
                _enc=sys.getfilesystemencoding(), _Denied=PermissionError):
        # C events carry the converted path; a str subclass is copied so that its methods cannot lie to the checks.
        kind = _type(obj)
        if kind is _int or obj is None:
            return None  # a file descriptor, checked when it was opened; or the default, the current directory
        if _issubclass(kind, _str):
            return _str.__str__(obj)
        if _issubclass(kind, _bytes):
            return _bytes.decode(obj, _enc, "surrogateescape")
        raise _Denied("sandbox: a path must be str or bytes")

    def resolve(path, _getcwd=posix.getcwd, _lstat=posix.lstat, _readlink=posix.readlink, _islink=stat.S_ISLNK,
                _item=tuple.__getitem__, _OSError=OSError, _Denied=PermissionError):
        # os.path.realpath, from C functions: the Python one reads module globals a snippet can rebind.
        if not path.startswith("/"):
            path = _getcwd() + "/" + path
        pending, resolved, hops = path.split("/")[::-1], "", 0
        while pending:
            part = pending.pop()
            if part == "" or part == ".":
                continue
            if part == "..":
                resolved = resolved.rpartition("/")[0]
                continue
            candidate = resolved + "/" + part
            try:
                is_link = _islink(_item(_lstat(candidate), 0))
            except _OSError:
                is_link = False
            if not is_link:
                resolved = candidate
                continue
            hops += 1
            if hops > 40:
                raise _Denied(f"sandbox: too many symbolic links in {path!r}")
            target = _readlink(candidate)
            resolved = "" if target.startswith("/") else resolved
            pending.extend(target.split("/")[::-1])
        return resolved or "/"

    def inside(path, roots):
        for root in roots:
            if path == root or path.startswith(root + "/"):
                return True
        return False

    def check_path(event, obj, mode, _workdir=(workdir,), _readable=(workdir, *roots), _devices=DEVICES,
                   _to_text=to_text, _resolve=resolve, _inside=inside, _Denied=PermissionError):
        path = _to_text(obj)
        if path is None:
            return None
        # A relative path may be resolved against a dir_fd the event does not show: without '..' it stays below it.
        if not path.startswith("/") and ".." in path.split("/"):
            raise _Denied(f"sandbox: relative paths with '..' are not allowed ({event} {path!r}); use an absolute path")
        real = _resolve(path)
        if mode == "read" and not (_inside(real, _readable) or real in _devices):
            raise _Denied(f"sandbox: reading {path!r} is not allowed: only the working directory and Python's files")
        if mode == "write" and not (_inside(real, _workdir) or real == "/dev/null"):
            raise _Denied(f"sandbox: writing {path!r} is not allowed: only inside the working directory")
        if mode == "chdir" and not _inside(real, _workdir):
            raise _Denied(f"sandbox: changing directory to {path!r} is not allowed: only inside the working directory")
        return real

    def check_open(path_arg, flags, _workdir=(workdir,), _devices=DEVICES, _write=WRITE_FLAGS, _check=check_path,
                   _inside=inside, _stat=posix.stat, _item=tuple.__getitem__, _isdir=stat.S_ISDIR,
                   _isreg=stat.S_ISREG, _isfifo=stat.S_ISFIFO, _type=type, _int=int, _OSError=OSError,
                   _Denied=PermissionError):
        writing = _type(flags) is not _int or flags & _write
        real = _check("open", path_arg, "write" if writing else "read")
        if real is None:
            return
        try:
            mode = _item(_stat(real), 0)
        except _OSError:
            return  # a file about to be created, or nothing to open
        # A directory descriptor outside would let a later relative open (dir_fd=...) escape the path checks.
        if _isdir(mode) and not _inside(real, _workdir):
            raise _Denied(f"sandbox: opening the directory {real!r} is not allowed")
        if not (_isreg(mode) or _isdir(mode) or _isfifo(mode)) and real not in _devices:
            raise _Denied(f"sandbox: opening the special file {real!r} is not allowed")

    def check_import(args, _str=str, _modules=DENIED_MODULES, _readable=roots, _to_text=to_text, _resolve=resolve,
                     _inside=inside, _Denied=ModuleNotFoundError):
        name = _str.__str__(args[0])
        if name.rpartition(".")[2] in _modules:
            raise _Denied(f"sandbox: the module {name!r} is not available")
        if args[1] is not None and not _inside(_resolve(_to_text(args[1])), _readable):
            raise _Denied(f"sandbox: loading the extension module {name!r} from outside Python's files is not allowed")

    # The helpers are reachable from the hook's frame (a traceback shows it): their defaults must stay put.
    guarded = (to_text, resolve, inside, check_path, check_open, check_import)

    def hook(event, args, _check_open=check_open, _check_path=check_path, _check_import=check_import,
             _guarded=guarded, _reads=READ_EVENTS, _writes=WRITE_EVENTS, _denied=DENIED, _pid=posix.getpid(),
             _getpid=posix.getpid, _forks=itertools.count(), _budget=fork_budget, _next=next, _af_unix=AF_UNIX,
             _Denied=PermissionError):
        if event == "open":
            _check_open(args[0], args[2])
        elif event in _reads:
            _check_path(event, args[0], "read")
        elif event in _writes:
            _check_path(event, args[0], "write")
            if event == "os.rename" or event == "os.link":
                _check_path(event, args[1], "write")
        elif event == "os.chdir":
            _check_path(event, args[0], "chdir")
        elif event == "import":
            _check_import(args)
        elif event == "os.fork" or event == "os.forkpty":
            # Forked children keep this hook; only the snippet's own process may fork, at most _budget times.
            if _getpid() != _pid or _next(_forks) >= _budget:
                raise _Denied(f"sandbox: starting processes ({event}) is not allowed")
        elif event == "object.__setattr__" or event == "object.__delattr__":
            for function in _guarded:
                if args[0] is function:
                    raise _Denied("sandbox: changing the sandbox's own functions is not allowed")
        elif event == "socket.__new__" and args[1] == _af_unix:
            return  # local socket pairs (asyncio's event loop); connect and bind stay refused
        else:
            for reason, names in _denied:
                for name in names:
                    if event == name or name[-1] == "." and event.startswith(name):
                        raise _Denied(f"sandbox: {reason} ({event}) is not allowed")

    return hook


def deny_fork_exec():
    """_posixsubprocess.fork_exec raises no audit event: subprocess and multiprocessing get one that refuses."""
    def fork_exec(*_args, _Denied=PermissionError):
        raise _Denied("sandbox: starting processes (_posixsubprocess.fork_exec) is not allowed")
    module = sys.modules.get("_posixsubprocess") or types.ModuleType("_posixsubprocess")
    setattr(module, "fork_exec", fork_exec)
    sys.modules["_posixsubprocess"] = module
    for name in DENIED_MODULES - {"_posixsubprocess"}:
        sys.modules.pop(name, None)


def report(error, _type=type, _str=str):
    """The snippet's traceback without the bootstrap's frames, last lines only, on stderr (merged with stdout)."""
    try:
        shown = traceback.TracebackException.from_exception(error)
        pending = [shown]
        while pending:
            current = pending.pop()
            current.stack = traceback.StackSummary.from_list([f for f in current.stack if f.filename != "<string>"])
            pending += [e for e in (current.__cause__, current.__context__) if e is not None]
        text = "\n".join("".join(shown.format()).splitlines()[-20:])
    except BaseException:  # the snippet broke what formatting needs (builtins, traceback): say less
        text = f"{_type(error).__name__}: {_str(error)}"
    os.write(2, (text + "\n").encode("utf-8", "replace"))


def run(source):
    linecache.cache["<snippet>"] = (len(source), None, source.splitlines(True), "<snippet>")
    try:
        exec(compile(source, "<snippet>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit:
        raise
    except BaseException as error:
        report(error)
        sys.exit(1)


def main():
    config = json.loads(sys.argv[1])
    source = open(config["snippet"], encoding="utf-8").read()
    os.remove(config["snippet"])
    isolated = enter_namespaces(config["parent_pid"])
    os.write(config["status_fd"], b"1" if isolated else b"0")
    os.close(config["status_fd"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if isolated:
        become_namespace_init(config["alarm_s"])
    else:
        signal.alarm(config["alarm_s"])
    set_limits(config)
    deny_fork_exec()
    sys.addaudithook(make_hook(os.path.realpath(config["workdir"]), read_roots(), config["max_processes"]))
    del config
    sys.argv = [""]
    run(source)


if __name__ == "__main__":  # always under -c; tests exec the definitions alone
    main()
