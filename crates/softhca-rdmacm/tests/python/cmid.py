"""pyverbs' rdma_cm API (python3-pyverbs' pyverbs.cmid, unmodified) on the drop-in
librdmacm.so.1, one side of a connection per process:

    cmid.py server <ip> <port>    listens, takes one request, accepts, echoes 10 messages
    cmid.py client <ip> <port>    connects, sends 10 messages, checks each echo

Synchronous ids (AddrInfo + CMID: rdma_getaddrinfo, rdma_create_ep, rdma_listen,
rdma_get_request, rdma_accept / rdma_connect), messages through the rdma_verbs.h helpers
(reg_msgs, post_recv, post_send, get_recv_comp, get_send_comp), then rdma_disconnect.
Prints "cmid <role>: ok" and exits 0 when everything matched."""

import sys

import pyverbs.cm_enums as ce
from pyverbs.cmid import AddrInfo, CMID
from pyverbs.qp import QPCap, QPInitAttr
import pyverbs.enums as e

ROUNDS = 10
SIZE = 64


def qp_init():
    return QPInitAttr(qp_type=e.IBV_QPT_RC, cap=QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1))


def wait(get):
    wc = None
    while wc is None:
        wc = get()
    if wc.status != e.IBV_WC_SUCCESS:
        raise RuntimeError(f"completion status {wc.status}")
    return wc


def main(role, ip, port):
    if role == "server":
        ai = AddrInfo(src=ip, src_service=port, port_space=ce.RDMA_PS_TCP, flags=ce.RAI_PASSIVE)
        listener = CMID(creator=ai, qp_init_attr=qp_init())
        listener.listen()
        cmid = listener.get_request()
        recv_mr, send_mr = cmid.reg_msgs(SIZE), cmid.reg_msgs(SIZE)
        cmid.post_recv(recv_mr)
        cmid.accept()
        for i in range(ROUNDS):
            wait(cmid.get_recv_comp)
            msg = recv_mr.read(SIZE, 0)
            if msg[:8] != f"ping {i:03d}".encode():
                raise RuntimeError(f"round {i}: got {msg[:8]!r}")
            cmid.post_recv(recv_mr)
            send_mr.write(msg.replace(b"ping", b"pong"), SIZE)
            cmid.post_send(send_mr)
            wait(cmid.get_send_comp)
    else:
        ai = AddrInfo(dst=ip, dst_service=port, port_space=ce.RDMA_PS_TCP)
        cmid = CMID(creator=ai, qp_init_attr=qp_init())
        recv_mr, send_mr = cmid.reg_msgs(SIZE), cmid.reg_msgs(SIZE)
        cmid.post_recv(recv_mr)
        cmid.connect()
        for i in range(ROUNDS):
            send_mr.write(f"ping {i:03d}".encode().ljust(SIZE, b"."), SIZE)
            cmid.post_send(send_mr)
            wait(cmid.get_send_comp)
            wait(cmid.get_recv_comp)
            msg = recv_mr.read(SIZE, 0)
            if msg[:8] != f"pong {i:03d}".encode():
                raise RuntimeError(f"round {i}: got {msg[:8]!r}")
            cmid.post_recv(recv_mr)
    cmid.disconnect()
    print(f"cmid {role}: ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
