#!/bin/sh
# A throwaway nginx on 127.0.0.1 serving a directory over HTTP and HTTPS (a CA made for the run),
# with nginx's own range, HEAD, 416 and ETag handling: the real server the remote source is
# tested against. Daemon, pid file, logs and keys live in STATE; nothing else is
# touched, no systemd.
#
#   tests/servers/nginx.sh start STATE ROOT   prints: http=PORT https=PORT ca=STATE/ca.pem
#   tests/servers/nginx.sh stop STATE
#
# Exits 77 (the tests' skip code) with a line saying why when nginx, openssl or python3 is
# missing (scripts/setup-debian.sh --tests installs them).
set -eu
cmd=${1:-}
state=${2:-}
[ -n "$cmd" ] && [ -n "$state" ] || {
	echo "usage: $0 start STATE ROOT | stop STATE" >&2
	exit 2
}

. "$(dirname "$0")/common.sh"

stop() {
	kill_pidfile "$state/nginx.pid"
}

if [ "$cmd" = stop ]; then
	stop
	exit 0
fi
[ "$cmd" = start ] || {
	echo "$0: unknown command $cmd" >&2
	exit 2
}
root=$(cd "${3:?ROOT}" && pwd)
for tool in nginx openssl python3; do
	command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || {
		echo "SKIP: $tool is not installed (scripts/setup-debian.sh --tests installs it)"
		exit 77
	}
done
nginx=$(command -v nginx 2>/dev/null || echo /usr/sbin/nginx)
mkdir -p "$state/tmp"
state=$(cd "$state" && pwd)

ports=$(free_ports 2)
http=${ports% *}
https=${ports#* }

# The CA and the server's certificate for 127.0.0.1, valid for the run only.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=kiln test CA" \
	-keyout "$state/ca.key" -out "$state/ca.pem" >/dev/null 2>&1
openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
	-keyout "$state/server.key" -out "$state/server.csr" >/dev/null 2>&1
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$state/san.ext"
openssl x509 -req -in "$state/server.csr" -CA "$state/ca.pem" -CAkey "$state/ca.key" \
	-CAcreateserial -days 2 -extfile "$state/san.ext" -out "$state/server.pem" >/dev/null 2>&1

user=""
[ "$(id -u)" -eq 0 ] && user="user root;" # workers must read ROOT and STATE as the caller does
cat >"$state/nginx.conf" <<CONF
$user
worker_processes 1;
daemon on;
pid $state/nginx.pid;
error_log $state/error.log warn;
events { worker_connections 256; }
http {
	access_log $state/access.log;
	client_body_temp_path $state/tmp/body;
	proxy_temp_path $state/tmp/proxy;
	fastcgi_temp_path $state/tmp/fastcgi;
	uwsgi_temp_path $state/tmp/uwsgi;
	scgi_temp_path $state/tmp/scgi;
	default_type application/octet-stream;
	sendfile on;
	keepalive_requests 100000;
	server {
		listen 127.0.0.1:$http;
		root $root;
	}
	server {
		listen 127.0.0.1:$https ssl;
		ssl_certificate $state/server.pem;
		ssl_certificate_key $state/server.key;
		root $root;
	}
}
CONF
"$nginx" -c "$state/nginx.conf" -p "$state" -e "$state/error.log" || {
	cat "$state/error.log" >&2 || true
	exit 1
}
# Up when it answers.
i=0
until python3 -c "import socket; socket.create_connection(('127.0.0.1', $http), 0.2)" \
	2>/dev/null; do
	i=$((i + 1))
	[ $i -lt 50 ] || {
		echo "$0: nginx did not answer on 127.0.0.1:$http" >&2
		stop
		exit 1
	}
	sleep 0.1
done
echo "http=$http https=$https ca=$state/ca.pem"
