"""Which network interface a node uses toward the master (stdlib only, Python 3.8+): one answer for the doctor's
`iface` finding (the probe) and for `socket_ifname: auto` (the agent), so the two never disagree."""

import socket
import struct

from launcher.node.wire import error_text, host_arg


def _ipv4_ifaces():
    """(name, address, netmask) of each IPv4 interface, via ioctl (Linux); empty where that does not work."""
    import fcntl

    out = []
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            packed = struct.pack("256s", name[:15].encode())
            try:
                addr = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), 0x8915, packed)[20:24])  # SIOCGIFADDR
                mask = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), 0x891B, packed)[20:24])  # SIOCGIFNETMASK
            except OSError:
                continue
            out.append((name, addr, mask))
    finally:
        sock.close()
    return out


def iface_holding(ip, same_subnet):
    """The interface that holds address `ip`; with `same_subnet`, else one whose IPv4 subnet contains it (127.0.0.5
    is on lo, 127.0.0.1/8). None when none does (ioctl, /proc/net/if_inet6)."""
    if ":" in ip:
        try:
            want = socket.inet_pton(socket.AF_INET6, ip).hex()
            with open("/proc/net/if_inet6") as handle:
                for line in handle:
                    parts = line.split()
                    if len(parts) >= 6 and parts[0] == want:
                        return parts[5]
        except (OSError, ValueError):
            pass
        return None
    try:
        ifaces = _ipv4_ifaces()
        target = struct.unpack("!I", socket.inet_aton(ip))[0]
    except (OSError, ImportError, AttributeError):
        return None
    for name, addr, _ in ifaces:
        if addr == ip:
            return name
    if same_subnet:
        for name, addr, mask in ifaces:
            bits = struct.unpack("!I", socket.inet_aton(mask))[0]
            if struct.unpack("!I", socket.inet_aton(addr))[0] & bits == target & bits:
                return name
    return None


def route_to(master_addr, master_port):
    """{"ip", "iface"}: the address and interface this node uses toward master_addr ("iface" None when no
    interface holds that address); {"error", "stage"} when there is none (stage: "resolve" or "route").

    Every address master_addr resolves to is looked at first: on the master's own node the route to its own
    address is via lo while its peers come in on the interface that holds it, and a name may resolve to several
    addresses of which only a later one is this node's. Otherwise a UDP connect (it sends nothing) to the first
    address gives the source address, and the interface is the one holding it or on its subnet.
    """
    try:
        infos = socket.getaddrinfo(host_arg(master_addr), master_port, 0, socket.SOCK_DGRAM)
    except (OSError, UnicodeError) as exc:
        return {"error": error_text(exc), "stage": "resolve"}
    for info in infos:
        ip = info[4][0].split("%")[0]
        name = iface_holding(ip, same_subnet=False)
        if name is not None:
            return {"ip": ip, "iface": name}
    family, _, _, _, sockaddr = infos[0]
    try:
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.connect(sockaddr)
            ip = sock.getsockname()[0].split("%")[0]
        finally:
            sock.close()
    except OSError as exc:
        return {"error": error_text(exc), "stage": "route"}
    return {"ip": ip, "iface": iface_holding(ip, same_subnet=True)}


def route_iface(master_addr, master_port):
    """(interface, None): the one this node reaches master_addr through (`route_to`); (None, why) when none."""
    route = route_to(master_addr, master_port)
    if route.get("stage") == "resolve":
        return None, "it does not resolve here (%s)" % route["error"]
    if "error" in route:
        return None, "no route to it (%s)" % route["error"]
    if route["iface"] is None:
        return None, "no interface here holds %s, the address this node sends to it from" % route["ip"]
    return route["iface"], None
