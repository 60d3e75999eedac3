"""What every target shares about the machine and its processes: host facts (a
cgroup-aware RAM probe), owned scratch directories, SIGTERM handling, background load."""
