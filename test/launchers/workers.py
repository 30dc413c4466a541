"""Lists the dgemma-run workers a launcher started: `workers.py ROOT_PID` prints one line per
dgemma-run process below ROOT_PID (children, grandchildren, ...) whose parent is not itself
dgemma-run: `PID RANK RESTART_COUNT`, the last two from the process's environment (RANK and
TORCHELASTIC_RESTART_COUNT; '-' when unset). Read from /proc; processes that go away while being
read are left out."""
import os
import sys


def parent_and_exe(pid):
    with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        exe = ""
    return int(fields[1]), exe


def environment(pid):
    with open(f"/proc/{pid}/environ", "rb") as environ:
        entries = environ.read().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in entries if b"=" in e)


def main():
    root = int(sys.argv[1])
    processes = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                processes[int(name)] = parent_and_exe(int(name))
            except (OSError, IndexError, ValueError):
                pass
    def below_root(pid):
        seen = set()
        while pid in processes and pid not in seen:
            seen.add(pid)
            pid = processes[pid][0]
            if pid == root:
                return True
        return False
    for pid, (parent, exe) in sorted(processes.items()):
        if exe != "dgemma-run" or processes.get(parent, (0, ""))[1] == "dgemma-run" or not below_root(pid):
            continue
        try:
            env = environment(pid)
        except OSError:
            continue
        print(pid, env.get("RANK", "-"), env.get("TORCHELASTIC_RESTART_COUNT", "-"))


if __name__ == "__main__":
    main()
