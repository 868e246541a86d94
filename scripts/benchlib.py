"""Helpers shared by the Python benchmarks (scripts/bench-ha.py, scripts/bench-alloc.py)."""
import random
import socket


def free_port_pair():
    """A port P on 127.0.0.1 with P and P + 1 free (a Cairn node's API and cluster ports)."""
    for _ in range(200):
        p = random.randint(20000, 30000)
        ok = True
        for q in (p, p + 1):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", q))
            except OSError:
                ok = False
            finally:
                s.close()
        if ok:
            return p
    raise RuntimeError("no free port pair")
