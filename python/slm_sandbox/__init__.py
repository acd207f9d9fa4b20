"""The slm-train Python sandbox worker's modules (python/sandbox_runner.py is the entry point and
describes the whole; standard library only):

- protocol: MessagePack codec, length-prefixed frames, the limits host, zygote and child share;
- seccomp:  the BPF filter, assembled once in the zygote and installed in the child; prctl();
- tools:    the host-run tools a program calls (search primitives, sandbox.tools_module functions);
- program:  one program's namespace, output capture and error line;
- child:    the forked child: lock-down (descriptors, environment, uid, limits, seccomp), run, report;
- zygote:   the worker loop: prepares a child, hands it a program, relays calls, enforces the deadline;
- probe:    what this machine allows (capabilities) and what the interpreter reads (bubblewrap's list);
- runner:   main(): --probe, or start the zygote.

Every module is imported when the worker starts, before any child is forked: a child (after the uid
drop and the seccomp filter) never imports any of them.
"""
