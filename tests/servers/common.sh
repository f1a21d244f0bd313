# Shared by the test servers (nginx.sh, rgw.sh) and the scripts that start them
# (servers_test.sh, remote_test.sh); sourced, POSIX sh.

# N free TCP ports on 127.0.0.1, space separated (the kernel's choice; a clash after this is a
# failed start).
free_ports() {
	python3 -c 'import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))' "$1"
}

# Stop the process a pid file names: TERM, then KILL after 5 s; the file is removed.
kill_pidfile() {
	[ -f "$1" ] || return 0
	pid=$(cat "$1")
	kill "$pid" 2>/dev/null || true
	i=0
	while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	kill -9 "$pid" 2>/dev/null || true
	rm -f "$1"
}

# Run `SCRIPT start ARGS...` of a server and set the variables it prints (http= https= ca=,
# endpoint= access= secret=); when it fails, the caller exits with its message and status (77:
# the server cannot be installed, a skip).
start_server() {
	_rc=0
	_out=$("$@") || _rc=$?
	[ $_rc -eq 0 ] || {
		echo "$_out"
		exit $_rc
	}
	eval "$_out"
}
