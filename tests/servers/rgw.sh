#!/bin/sh
# A throwaway Ceph cluster on 127.0.0.1 with its S3 gateway: one mon, one memstore OSD (the
# data lives in memory: a restart of the OSD loses it, so fault tests restart radosgw alone),
# pools of size 1, radosgw (beast) and a user with known keys. cephx throughout: radosgw will
# not start with authentication off. Daemons, pid files, keyrings and logs live in STATE; no
# systemd, nothing outside STATE is touched.
#
#   tests/servers/rgw.sh start STATE   prints: endpoint=http://127.0.0.1:PORT access=KEY secret=KEY
#   tests/servers/rgw.sh restart-rgw STATE   (radosgw alone, same port and data)
#   tests/servers/rgw.sh stop STATE
#
# Exits 77 (the tests' skip code) with a line saying why when Ceph is not installed
# (scripts/setup-debian.sh --tests installs ceph-mon, ceph-osd, radosgw and ceph-common).
set -eu
cmd=${1:-}
state=${2:-}
[ -n "$cmd" ] && [ -n "$state" ] || {
	echo "usage: $0 start|restart-rgw|stop STATE" >&2
	exit 2
}
ACCESS=KILNTESTACCESSKEY
SECRET=kilntestsecretkey0123456789

. "$(dirname "$0")/common.sh"

stop() {
	for d in client.rgw.a osd.0 mon.a; do
		kill_pidfile "$state/run/$d.pid"
	done
}

wait_http() { # port
	i=0
	until curl -s -o /dev/null "http://127.0.0.1:$1/"; do
		i=$((i + 1))
		[ $i -lt 200 ] || return 1
		sleep 0.1
	done
}

start_rgw() {
	radosgw -c "$state/ceph.conf" -n client.rgw.a >>"$state/start.log" 2>&1
	wait_http "$(cat "$state/rgw.port")" || {
		echo "$0: radosgw did not answer (see $state/client.rgw.a.log)" >&2
		return 1
	}
}

case $cmd in
stop)
	stop
	exit 0
	;;
restart-rgw)
	kill_pidfile "$state/run/client.rgw.a.pid"
	start_rgw
	exit 0
	;;
start) ;;
*)
	echo "$0: unknown command $cmd" >&2
	exit 2
	;;
esac

for tool in ceph-mon ceph-osd radosgw radosgw-admin ceph ceph-authtool monmaptool curl python3; do
	command -v "$tool" >/dev/null 2>&1 || {
		echo "SKIP: $tool is not installed (scripts/setup-debian.sh --tests installs Ceph's packages)"
		exit 77
	}
done
mkdir -p "$state"
state=$(cd "$state" && pwd)
rm -rf "$state/mon" "$state/osd" "$state/rgw" "$state/run"
mkdir -p "$state/mon" "$state/osd" "$state/rgw" "$state/run"
ports=$(free_ports 2)
mon_port=${ports% *}
rgw_port=${ports#* }
echo "$rgw_port" >"$state/rgw.port"
fsid=$(cat /proc/sys/kernel/random/uuid)
cat >"$state/ceph.conf" <<CONF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$mon_port
keyring = $state/\$name.keyring
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
osd pool default pg num = 8
osd pool default pgp num = 8
mon warn on pool no redundancy = false
osd objectstore = memstore
memstore device bytes = 6442450944
run dir = $state/run
log file = $state/\$name.log
admin socket = $state/run/\$name.asok
pid file = $state/run/\$name.pid
[mon.a]
mon data = $state/mon
[osd.0]
osd data = $state/osd
keyring = $state/osd/keyring
[client.rgw.a]
# tcp_nodelay: without it beast holds a response's last small segment for the client's
# delayed ACK, 40 ms per request (a directory-only model's tensor reads took 17 ms each).
rgw frontends = beast endpoint=127.0.0.1:$rgw_port tcp_nodelay=1
rgw data = $state/rgw
CONF
c="-c $state/ceph.conf"
log=$state/start.log
: >"$log"
{
	ceph-authtool --create-keyring "$state/mon..keyring" --gen-key -n mon. --cap mon 'allow *'
	ceph-authtool --create-keyring "$state/client.admin.keyring" --gen-key -n client.admin \
		--cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *'
	ceph-authtool "$state/mon..keyring" --import-keyring "$state/client.admin.keyring"
	monmaptool --create --addv a "[v2:127.0.0.1:$mon_port]" --fsid "$fsid" "$state/monmap"
	ceph-mon $c --mkfs -i a --monmap "$state/monmap" --keyring "$state/mon..keyring"
	ceph-mon $c -i a
	uuid=$(cat /proc/sys/kernel/random/uuid)
	timeout 30 ceph $c osd new "$uuid"
	ceph-osd $c -i 0 --mkfs --mkkey --no-mon-config --osd-uuid "$uuid"
	timeout 30 ceph $c auth add osd.0 osd 'allow *' mon 'allow profile osd' -i "$state/osd/keyring"
	ceph-osd $c -i 0
} >>"$log" 2>&1 || {
	echo "$0: the cluster did not start (see $log)" >&2
	stop
	exit 1
}
i=0
until timeout 5 ceph $c osd stat 2>/dev/null | grep -q "1 up"; do
	i=$((i + 1))
	[ $i -lt 120 ] || {
		echo "$0: the OSD did not come up (see $state/osd.0.log)" >&2
		stop
		exit 1
	}
	sleep 0.25
done
timeout 30 ceph $c auth get-or-create client.rgw.a mon 'allow rw' osd 'allow rwx' \
	>"$state/client.rgw.a.keyring" 2>>"$log"
start_rgw || {
	stop
	exit 1
}
radosgw-admin $c user create --uid=kiln --display-name=kiln --access-key=$ACCESS \
	--secret=$SECRET >>"$log" 2>&1 || {
	echo "$0: radosgw-admin user create failed (see $log)" >&2
	stop
	exit 1
}
echo "endpoint=http://127.0.0.1:$rgw_port access=$ACCESS secret=$SECRET"
