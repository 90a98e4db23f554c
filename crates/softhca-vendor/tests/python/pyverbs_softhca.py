#!/usr/bin/python3
"""Debian's python3-pyverbs driving softhca through the drop-in libibverbs.so.1.

Opens the device, queries it, its port and GID; makes a PD, an MR, a CQ and an extended CQ,
RC, UC and UD QPs (plain and extended), takes them to RTS between two contexts of the
device, moves data with the old posting API (post_send / poll) and the new one (wr_* /
start_poll), and checks every completion and every byte. Run by
crates/softhca-vendor/tests/pyverbs.rs with LD_LIBRARY_PATH at the drop-in libraries.
"""

import socket
import sys
import time
import unittest

import pyverbs.enums as e
from pyverbs.addr import AH, AHAttr, GlobalRoute
from pyverbs.cq import CQ, CQEX, CqInitAttrEx, PollCqAttr
from pyverbs.device import Context, get_device_list
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPEx, QPInitAttr, QPInitAttrEx
from pyverbs.wr import SGE, RecvWR, SendWR

DEV = "softhca0"
PORT = 1
GID_INDEX = 0
SIZE = 4096
UD_QKEY = 0x11111111
GRH = 40
TIMEOUT = 10


def poll(cq, count=1):
    """Polls `count` completions from a plain CQ, 10 s at most."""
    wcs = []
    end = time.monotonic() + TIMEOUT
    while len(wcs) < count:
        n, got = cq.poll(count - len(wcs))
        wcs.extend(got[:n])
        if time.monotonic() > end:
            raise AssertionError(f"{len(wcs)} of {count} completions")
    return wcs


def poll_ex(cq):
    """One completion from an extended CQ: (status, wr_id, opcode, byte_len, imm, qp_num)."""
    end = time.monotonic() + TIMEOUT
    attr = PollCqAttr()
    while cq.start_poll(attr) != 0:
        if time.monotonic() > end:
            raise AssertionError("no completion")
    got = (cq.status, cq.wr_id, cq.read_opcode(), cq.read_byte_len(), cq.read_imm_data(), cq.read_qp_num())
    cq.end_poll()
    return got


class End:
    """One side: a context of softhca0 with a PD, a buffer, CQs and a QP."""

    def __init__(self, qp_type, extended):
        self.ctx = Context(name=DEV)
        self.pd = PD(self.ctx)
        access = e.IBV_ACCESS_LOCAL_WRITE
        if qp_type != e.IBV_QPT_UD:
            access |= e.IBV_ACCESS_REMOTE_WRITE
        if qp_type == e.IBV_QPT_RC:
            access |= e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC
        self.mr = MR(self.pd, SIZE + GRH, access)
        self.qp_type = qp_type
        self.extended = extended
        cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
        if extended:
            self.cq = CQEX(self.ctx, CqInitAttrEx(cqe=64, wc_flags=e.IBV_WC_STANDARD_FLAGS))
            ops = e.IBV_QP_EX_WITH_SEND | e.IBV_QP_EX_WITH_SEND_WITH_IMM
            if qp_type != e.IBV_QPT_UD:
                ops |= e.IBV_QP_EX_WITH_RDMA_WRITE | e.IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
            if qp_type == e.IBV_QPT_RC:
                ops |= (e.IBV_QP_EX_WITH_RDMA_READ | e.IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
                        | e.IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
            init = QPInitAttrEx(qp_type=qp_type, scq=self.cq, rcq=self.cq, cap=cap, pd=self.pd,
                                comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                                send_ops_flags=ops)
            self.qp = QPEx(self.ctx, init)
        else:
            self.cq = CQ(self.ctx, 64)
            self.qp = QP(self.pd, QPInitAttr(qp_type=qp_type, scq=self.cq, rcq=self.cq, cap=cap))
        self.gid = self.ctx.query_gid(PORT, GID_INDEX)

    def connect(self, peer):
        """Reset -> Init -> RTR -> RTS toward `peer`."""
        attr = QPAttr(port_num=PORT)
        if self.qp_type == e.IBV_QPT_UD:
            attr.qkey = UD_QKEY
            self.qp.to_rts(attr)
            return
        attr.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE
        if self.qp_type == e.IBV_QPT_RC:
            attr.qp_access_flags |= e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC
            attr.max_dest_rd_atomic = 1
            attr.max_rd_atomic = 1
            attr.min_rnr_timer = 12
            attr.timeout = 14
            attr.retry_cnt = 7
            attr.rnr_retry = 7
        attr.path_mtu = e.IBV_MTU_1024
        attr.dest_qp_num = peer.qp.qp_num
        attr.rq_psn = 0
        attr.sq_psn = 0
        gr = GlobalRoute(dgid=peer.gid, sgid_index=GID_INDEX)
        attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=PORT)
        self.qp.to_rts(attr)

    def recv(self, wr_id, length=SIZE + GRH):
        self.qp.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[SGE(self.mr.buf, length, self.mr.lkey)]))

    def completion(self):
        """(status, wr_id, opcode, byte_len, imm) of the next completion."""
        if self.extended:
            return poll_ex(self.cq)[:5]
        wc = poll(self.cq)[0]
        return (wc.status, wc.wr_id, wc.opcode, wc.byte_len, wc.imm_data)

    def ud_ah(self, peer):
        gr = GlobalRoute(dgid=peer.gid, sgid_index=GID_INDEX)
        return AH(self.pd, attr=AHAttr(gr=gr, is_global=1, port_num=PORT))


class PyverbsOnSofthca(unittest.TestCase):
    def test_device_port_gid(self):
        names = [d.name.decode() for d in get_device_list()]
        self.assertEqual(names, [DEV])
        with Context(name=DEV) as ctx:
            attr = ctx.query_device()
            self.assertGreater(attr.max_qp, 0)
            self.assertEqual(attr.phys_port_cnt, 1)
            ex = ctx.query_device_ex()
            self.assertEqual(ex.phys_port_cnt_ex, 1)
            port = ctx.query_port(PORT)
            self.assertEqual(port.state, e.IBV_PORT_ACTIVE)
            self.assertEqual(port.link_layer, e.IBV_LINK_LAYER_ETHERNET)
            gid = ctx.query_gid(PORT, GID_INDEX)
            self.assertTrue(str(gid).startswith("0000:0000:0000:0000:0000:ffff:"), str(gid))
            entry = ctx.query_gid_ex(PORT, GID_INDEX)
            self.assertEqual(entry.gid_type, e.IBV_GID_TYPE_ROCE_V2)

    def pair(self, qp_type, extended):
        a, b = End(qp_type, extended), End(qp_type, extended)
        a.connect(b)
        b.connect(a)
        return a, b

    def send(self, a, b, imm, extended):
        """A Send (with immediate if `imm`) of 64 bytes from a to b; checks both sides."""
        payload = bytes(range(64))
        a.mr.write(payload, 64)
        b.recv(7)
        sge = SGE(a.mr.buf, 64, a.mr.lkey)
        ah = a.ud_ah(b) if a.qp_type == e.IBV_QPT_UD else None
        if extended:
            a.qp.wr_start()
            a.qp.wr_id = 1
            a.qp.wr_flags = e.IBV_SEND_SIGNALED
            if imm:
                a.qp.wr_send_imm(0x1234)  # pyverbs puts it in network order
            else:
                a.qp.wr_send()
            if ah is not None:
                a.qp.wr_set_ud_addr(ah, b.qp.qp_num, UD_QKEY)
            a.qp.wr_set_sge(sge)
            a.qp.wr_complete()
        else:
            opcode = e.IBV_WR_SEND_WITH_IMM if imm else e.IBV_WR_SEND
            wr = SendWR(wr_id=1, opcode=opcode, num_sge=1, sg=[sge], send_flags=e.IBV_SEND_SIGNALED)
            if imm:
                wr.imm_data = socket.htonl(0x1234)
            if ah is not None:
                wr.set_wr_ud(ah, b.qp.qp_num, UD_QKEY)
            a.qp.post_send(wr)
        status, wr_id, opcode, _, _ = a.completion()
        self.assertEqual((status, wr_id, opcode), (e.IBV_WC_SUCCESS, 1, e.IBV_WC_SEND))
        status, wr_id, opcode, length, imm_data = b.completion()
        grh = GRH if a.qp_type == e.IBV_QPT_UD else 0
        self.assertEqual((status, wr_id, opcode, length), (e.IBV_WC_SUCCESS, 7, e.IBV_WC_RECV, 64 + grh))
        if imm:
            self.assertEqual(socket.ntohl(imm_data), 0x1234)
        self.assertEqual(b.mr.read(64, grh), payload)

    def write(self, a, b, extended):
        """An RDMA Write of 256 bytes into b's buffer (signaled on a)."""
        payload = bytes((i * 7) & 0xFF for i in range(256))
        a.mr.write(payload, 256)
        sge = SGE(a.mr.buf, 256, a.mr.lkey)
        if extended:
            a.qp.wr_start()
            a.qp.wr_id = 2
            a.qp.wr_flags = e.IBV_SEND_SIGNALED
            a.qp.wr_rdma_write(b.mr.rkey, b.mr.buf + 1024)
            a.qp.wr_set_sge(sge)
            a.qp.wr_complete()
        else:
            wr = SendWR(wr_id=2, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge],
                        send_flags=e.IBV_SEND_SIGNALED)
            wr.set_wr_rdma(b.mr.rkey, b.mr.buf + 1024)
            a.qp.post_send(wr)
        status, wr_id, opcode, _, _ = a.completion()
        self.assertEqual((status, wr_id, opcode), (e.IBV_WC_SUCCESS, 2, e.IBV_WC_RDMA_WRITE))
        # An RC Write completes once acknowledged, so its bytes are there; a UC one once sent,
        # so they are on their way.
        end = time.monotonic() + TIMEOUT
        while b.mr.read(256, 1024) != payload and time.monotonic() < end:
            time.sleep(0.001)
        self.assertEqual(b.mr.read(256, 1024), payload)

    def read_and_atomics(self, a, b, extended):
        b.mr.write(b"\x05" * 32, 32, 2048)
        b.mr.write((100).to_bytes(8, "little"), 8, 3072)
        sge = SGE(a.mr.buf + 512, 32, a.mr.lkey)
        res = SGE(a.mr.buf + 600, 8, a.mr.lkey)
        if extended:
            a.qp.wr_start()
            a.qp.wr_flags = e.IBV_SEND_SIGNALED
            a.qp.wr_id = 3
            a.qp.wr_rdma_read(b.mr.rkey, b.mr.buf + 2048)
            a.qp.wr_set_sge(sge)
            a.qp.wr_id = 4
            a.qp.wr_atomic_fetch_add(b.mr.rkey, b.mr.buf + 3072, 5)
            a.qp.wr_set_sge(res)
            a.qp.wr_complete()
            got = [a.completion() for _ in range(2)]
        else:
            rd = SendWR(wr_id=3, opcode=e.IBV_WR_RDMA_READ, num_sge=1, sg=[sge], send_flags=e.IBV_SEND_SIGNALED)
            rd.set_wr_rdma(b.mr.rkey, b.mr.buf + 2048)
            a.qp.post_send(rd)
            fa = SendWR(wr_id=4, opcode=e.IBV_WR_ATOMIC_FETCH_AND_ADD, num_sge=1, sg=[res],
                        send_flags=e.IBV_SEND_SIGNALED)
            fa.set_wr_atomic(b.mr.rkey, b.mr.buf + 3072, 5, 0)
            a.qp.post_send(fa)
            got = [a.completion() for _ in range(2)]
        self.assertEqual([g[:3] for g in got], [(e.IBV_WC_SUCCESS, 3, e.IBV_WC_RDMA_READ),
                                                 (e.IBV_WC_SUCCESS, 4, e.IBV_WC_FETCH_ADD)])
        self.assertEqual(a.mr.read(32, 512), b"\x05" * 32)
        self.assertEqual(int.from_bytes(a.mr.read(8, 600), "little"), 100)
        self.assertEqual(int.from_bytes(b.mr.read(8, 3072), "little"), 105)

    def run_type(self, qp_type, extended):
        a, b = self.pair(qp_type, extended)
        self.send(a, b, False, extended)
        self.send(b, a, True, extended)
        if qp_type != e.IBV_QPT_UD:
            self.write(a, b, extended)
        if qp_type == e.IBV_QPT_RC:
            self.read_and_atomics(a, b, extended)

    def test_rc_old_api(self):
        self.run_type(e.IBV_QPT_RC, False)

    def test_rc_new_api(self):
        self.run_type(e.IBV_QPT_RC, True)

    def test_uc_old_api(self):
        self.run_type(e.IBV_QPT_UC, False)

    def test_uc_new_api(self):
        self.run_type(e.IBV_QPT_UC, True)

    def test_ud_old_api(self):
        self.run_type(e.IBV_QPT_UD, False)

    def test_ud_new_api(self):
        self.run_type(e.IBV_QPT_UD, True)


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() else 1)
