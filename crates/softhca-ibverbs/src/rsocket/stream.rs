//! One connected stream rsocket's state and its data path, as librdmacm 44 runs it:
//!
//! - Each end has a receive buffer (`rbuf`, `SO_RCVBUF`'s size, default 128 KiB) that the
//!   peer writes into with RDMA Write with Immediate, half of it at a time: the first half is
//!   offered in the connection data, each next one, once the reader has emptied as much, by
//!   writing its `rs_sge` into the peer's target SGL (two entries, used in turn) with an
//!   immediate `SGL` message.
//! - The immediate data says what a write was (`wire::op`): data (its length), a buffer or
//!   credits (`SGL`), control (disconnect, shutdown, keep-alive). Receives are zero-length
//!   work requests; what they complete with goes into a ring of received messages (`rmsg`),
//!   read in order by `rrecv`.
//! - Credits: a sender may have as many messages in the peer's ring as the peer has receives
//!   (`sseq_no` against `sseq_comp`, which every `SGL` message moves); control messages use
//!   four send queue entries of their own (`ctrl_seqno` against `ctrl_max_seqno`).
//! - A send copies into the send buffer (`sbuf`, `SO_SNDBUF`) unless it fits inline, and is
//!   complete when the write's completion returns the space.

use std::alloc::Layout;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use super::wire::{self, ctrl, msg, msg_data, msg_op, op, RsSge};
use crate::abi::*;
use crate::rdmacm::abi::rdma_cm_id;

pub(super) const SNDLOWAT: u32 = 2048;
const QP_CTRL_SIZE: u32 = 4;
const QP_MIN_SIZE: u16 = 16;
pub(super) const QP_MAX_SIZE: u16 = 0xFFFE;
/// A control message's largest payload (an `rs_sge`), and the send buffer's room for four.
const MAX_CTRL_MSG: u32 = 16;

/// The socket's states, ordered passive, connecting, connected, disconnected (`rs_state`).
pub(super) mod st {
    pub const INIT: u32 = 0;
    pub const BOUND: u32 = 0x0001;
    pub const LISTENING: u32 = 0x0002;
    pub const OPENING: u32 = 0x0004;
    pub const RESOLVING_ADDR: u32 = OPENING | 0x0010;
    pub const RESOLVING_ROUTE: u32 = OPENING | 0x0020;
    pub const CONNECTING: u32 = OPENING | 0x0040;
    pub const ACCEPTING: u32 = OPENING | 0x0080;
    pub const CONNECTED: u32 = 0x0100;
    pub const WRITABLE: u32 = 0x0200;
    pub const READABLE: u32 = 0x0400;
    pub const CONNECT_RDWR: u32 = CONNECTED | READABLE | WRITABLE;
    pub const CONNECT_ERROR: u32 = 0x0800;
    pub const DISCONNECTED: u32 = 0x1000;
    pub const ERROR: u32 = 0x2000;
}

/// `RS_OPT_*` of a socket.
pub(super) const OPT_SWAP_SGL: u32 = 1 << 0;

/// Page-aligned zeroed memory registered on the id's PD (librdmacm's `forksafe_alloc` and
/// `rdma_reg_msgs` / `rdma_reg_write`).
pub(super) struct Region {
    ptr: *mut u8,
    layout: Layout,
    mr: *mut ibv_mr,
}

impl Region {
    fn new(pd: *mut ibv_pd, len: usize, access: u32) -> Result<Region, c_int> {
        let layout = Layout::from_size_align(len.max(1).next_multiple_of(4096), 4096).map_err(|_| libc::ENOMEM)?;
        // SAFETY: a layout of non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: the PD of the socket's id; memory just allocated, `len` bytes of it.
        let mr = unsafe { crate::mem::ibv_reg_mr(pd, ptr.cast(), len, access as c_int) };
        if mr.is_null() {
            // SAFETY: allocated above with this layout.
            unsafe { std::alloc::dealloc(ptr, layout) };
            return Err(errno());
        }
        Ok(Region { ptr, layout, mr })
    }

    fn addr(&self) -> u64 {
        self.ptr as u64
    }
    fn lkey(&self) -> u32 {
        // SAFETY: the region's live MR.
        unsafe { (*self.mr).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the MR and memory made in `new`, released once.
        unsafe {
            crate::mem::ibv_dereg_mr(self.mr);
            std::alloc::dealloc(self.ptr, self.layout);
        }
    }
}

/// The calling thread's errno.
pub(super) fn errno() -> c_int {
    // SAFETY: the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// The sizes a socket is made with (inherited by the sockets a listener accepts).
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizes {
    pub sbuf: u32,
    pub rbuf: u32,
    pub sq: u16,
    pub rq: u16,
    pub inline: u16,
    pub iomap: u16,
}

/// A stream socket's connection: its queue pair's resources and the protocol's counters
/// (librdmacm's `struct rsocket`, stream half). Guarded by the socket's lock (`cq_lock`).
pub(super) struct Stream {
    pub state: u32,
    pub err: c_int,
    pub opts: u32,
    pub sizes: Sizes,
    pub id: *mut rdma_cm_id,

    pub ctrl_seqno: u32,
    pub ctrl_max_seqno: u32,
    pub sseq_no: u16,
    pub sseq_comp: u16,
    pub rseq_no: u16,
    pub rseq_comp: u16,

    remote_sge: u32,
    remote_sgl: RsSge,
    target_sge: usize,
    target: Option<Region>,
    rbuf: Option<Region>,
    sbuf: Option<Region>,

    rbuf_offset: u32,
    rbuf_free_offset: u32,
    /// Receive-buffer bytes read and not yet offered to the peer again.
    rbuf_bytes_avail: u32,
    /// Receive-buffer bytes offered to the peer that no message has yet said it wrote: what
    /// the peer may still claim. With `rbuf_bytes_avail` and the bytes of the messages not
    /// yet read, it makes up the two halves of the buffer, which bounds all three.
    rbuf_granted: u32,
    sbuf_bytes_avail: u32,
    /// The send buffer's next free byte (`ssgl[0].addr`), an offset.
    sbuf_head: u32,
    /// Received messages not yet read: (operation, length left).
    rmsg: Vec<(u32, u32)>,
    rmsg_head: usize,
    rmsg_tail: usize,
    pub sqe_avail: u32,
    /// The peer's I/O map: where the entries for this end's writable mappings go.
    remote_iomap: RsSge,
    /// The program's mappings (`riomap`).
    iomaps: Vec<IoMap>,
}

/// Where a write goes.
pub(super) enum Dest {
    /// The peer's receive buffer, as a message: its current target entry as [`Stream::fit`]
    /// read it (the peer may rewrite the entry at any time; the write goes by this copy).
    Data(RsSge),
    /// A region the peer mapped (`riowrite`): no message.
    Direct { addr: u64, rkey: u32 },
    /// Entry `index` of the peer's I/O map.
    Iomap { index: u32 },
}

/// A mapping of the program's memory (`riomap`); `index`, the slot in the peer's I/O map of
/// a writable one, which is told to the peer once (`sent`).
pub(super) struct IoMap {
    mr: *mut ibv_mr,
    offset: u64,
    index: Option<usize>,
    sent: bool,
}

// SAFETY: the raw pointers name objects of this library (the id, its QP and CQ, the
// registered regions) that live as long as the stream and are used under the socket's lock.
unsafe impl Send for Stream {}

impl Stream {
    pub fn new(sizes: Sizes) -> Stream {
        Stream {
            state: st::INIT,
            err: 0,
            opts: 0,
            sizes,
            id: null_mut(),
            ctrl_seqno: 0,
            ctrl_max_seqno: QP_CTRL_SIZE,
            sseq_no: 0,
            sseq_comp: 0,
            rseq_no: 0,
            rseq_comp: 0,
            remote_sge: 0,
            remote_sgl: RsSge::default(),
            target_sge: 0,
            target: None,
            rbuf: None,
            sbuf: None,
            rbuf_offset: 0,
            rbuf_free_offset: 0,
            rbuf_bytes_avail: 0,
            rbuf_granted: 0,
            sbuf_bytes_avail: 0,
            sbuf_head: 0,
            rmsg: Vec::new(),
            rmsg_head: 0,
            rmsg_tail: 0,
            sqe_avail: 0,
            remote_iomap: RsSge::default(),
            iomaps: Vec::new(),
        }
    }

    fn cm(&self) -> &rdma_cm_id {
        // SAFETY: the socket's id, live as long as the socket.
        unsafe { &*self.id }
    }

    pub fn cq(&self) -> *mut ibv_cq {
        self.cm().recv_cq
    }

    pub fn comp_channel(&self) -> *mut ibv_comp_channel {
        self.cm().recv_cq_channel
    }

    /// Creates the QP, its CQ and channel, and the registered buffers, and posts the receives
    /// (`rs_create_ep`): the id has its device (resolved, or a request's).
    pub fn create_ep(&mut self) -> Result<(), c_int> {
        let id = self.id;
        // SAFETY: the id's device context.
        let max = unsafe {
            let mut attr: ibv_device_attr = std::mem::zeroed();
            match crate::device::ibv_query_device((*id).verbs, &mut attr) {
                0 => attr.max_qp_wr.clamp(0, i32::from(QP_MAX_SIZE)) as u16,
                _ => QP_MAX_SIZE,
            }
        };
        let mut s = self.sizes;
        s.sq = s.sq.clamp(QP_MIN_SIZE, max.max(QP_MIN_SIZE));
        s.rq = s.rq.clamp(QP_MIN_SIZE, max.max(QP_MIN_SIZE));
        // SAFETY: the id's context; the channel and CQ go into the id's fields, where
        // rdma_destroy_qp destroys them (librdmacm's `rs_create_cq`).
        unsafe {
            let cm = &mut *id;
            cm.recv_cq_channel = crate::cq::ibv_create_comp_channel(cm.verbs);
            if cm.recv_cq_channel.is_null() {
                return Err(errno());
            }
            cm.recv_cq = crate::cq::ibv_create_cq(
                cm.verbs,
                c_int::from(s.sq) + c_int::from(s.rq),
                id.cast(),
                cm.recv_cq_channel,
                0,
            );
            if cm.recv_cq.is_null() {
                return Err(errno());
            }
            crate::cq::req_notify_cq(cm.recv_cq, 0);
            cm.send_cq_channel = cm.recv_cq_channel;
            cm.send_cq = cm.recv_cq;
        }
        // SAFETY: an all-zero init structure is valid.
        let mut qa: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        qa.send_cq = self.cq();
        qa.recv_cq = qa.send_cq;
        qa.qp_type = IBV_QPT_RC;
        qa.sq_sig_all = 1;
        qa.cap.max_send_wr = u32::from(s.sq);
        qa.cap.max_recv_wr = u32::from(s.rq);
        qa.cap.max_send_sge = 2;
        qa.cap.max_recv_sge = 1;
        qa.cap.max_inline_data = u32::from(s.inline);
        // SAFETY: the id (with its PD from the device) and a local attribute structure.
        if unsafe { crate::rdmacm::qp::softhca_rdma_create_qp(id, null_mut(), &mut qa) } != 0 {
            return Err(errno());
        }
        s.inline = qa.cap.max_inline_data.min(u32::from(u16::MAX)) as u16;
        self.sizes = s;
        self.init_bufs()?;
        for _ in 0..self.sizes.rq {
            self.post_recv()?;
        }
        Ok(())
    }

    /// `rs_init_bufs`.
    fn init_bufs(&mut self) -> Result<(), c_int> {
        let pd = self.cm().pd;
        let local = IBV_ACCESS_LOCAL_WRITE;
        let write = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
        let s = self.sizes;
        self.rmsg = vec![(0, 0); usize::from(s.rq) + 1];
        let ctrl = if u32::from(s.inline) < MAX_CTRL_MSG { MAX_CTRL_MSG * QP_CTRL_SIZE } else { 0 };
        self.sbuf = Some(Region::new(pd, (s.sbuf + ctrl) as usize, local)?);
        let tlen = std::mem::size_of::<RsSge>() * wire::SGL_SIZE as usize + wire::IOMAP_LEN * usize::from(s.iomap);
        self.target = Some(Region::new(pd, tlen, write)?);
        self.rbuf = Some(Region::new(pd, s.rbuf as usize, write)?);
        self.sbuf_head = 0;
        self.sbuf_bytes_avail = s.sbuf;
        self.rbuf_free_offset = s.rbuf >> 1;
        self.rbuf_bytes_avail = s.rbuf >> 1;
        // The first half, offered in the connection data.
        self.rbuf_granted = s.rbuf >> 1;
        self.sqe_avail = u32::from(s.sq) - self.ctrl_max_seqno;
        self.rseq_comp = s.rq >> 1;
        Ok(())
    }

    /// This end's connection data (`rs_format_conn_data`).
    pub fn conn_data(&self) -> wire::ConnData {
        let (Some(t), Some(r)) = (&self.target, &self.rbuf) else { unreachable!("connection data before the buffers") };
        wire::ConnData {
            version: wire::CONN_VERSION,
            flags: wire::CONN_FLAG_IOMAP | if cfg!(target_endian = "big") { wire::CONN_FLAG_NET } else { 0 },
            credits: self.sizes.rq,
            target_iomap_size: wire::value_to_scale(u32::from(self.sizes.iomap), 8) as u8,
            target_sgl: RsSge { addr: t.addr(), key: t.rkey(), length: wire::SGL_SIZE },
            data_buf: RsSge { addr: r.addr(), key: r.rkey(), length: self.sizes.rbuf >> 1 },
        }
    }

    /// Takes the peer's connection data (`rs_save_conn_data`).
    pub fn save_conn_data(&mut self, c: &wire::ConnData) {
        self.remote_sgl = c.target_sgl;
        self.remote_sge = 1;
        let net = cfg!(target_endian = "big");
        if net != (c.flags & wire::CONN_FLAG_NET != 0) {
            self.opts = OPT_SWAP_SGL;
        }
        if c.flags & wire::CONN_FLAG_IOMAP != 0 {
            // The peer's addresses are its own to choose: they wrap, as in librdmacm's C, and
            // its HCA checks them against the key.
            let sgl_len = std::mem::size_of::<RsSge>() as u64 * u64::from(c.target_sgl.length);
            self.remote_iomap = RsSge {
                addr: c.target_sgl.addr.wrapping_add(sgl_len),
                key: c.target_sgl.key,
                length: wire::scale_to_value(u32::from(c.target_iomap_size), 8),
            };
        }
        self.set_target(0, c.data_buf);
        self.sseq_comp = c.credits;
    }

    /// Entry `i` of this end's target SGL, which the peer writes.
    /// (Empty before the connection has its buffers.)
    fn target(&self, i: usize) -> RsSge {
        let Some(t) = &self.target else { return RsSge::default() };
        // SAFETY: `i` < SGL_SIZE entries of the registered target region; read volatile, as
        // the peer's writes land there without this thread.
        unsafe { std::ptr::read_volatile(t.ptr.cast::<RsSge>().add(i)) }
    }

    fn set_target(&mut self, i: usize, s: RsSge) {
        let Some(t) = &self.target else { return };
        // SAFETY: as in `target`.
        unsafe { std::ptr::write_volatile(t.ptr.cast::<RsSge>().add(i), s) };
    }

    pub fn can_send(&self) -> bool {
        self.sqe_avail > 0
            && self.sbuf_bytes_avail >= SNDLOWAT
            && self.sseq_no != self.sseq_comp
            && self.target(self.target_sge).length != 0
    }

    pub fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    pub fn have_rdata(&self) -> bool {
        self.rmsg_head != self.rmsg_tail
    }

    pub fn all_sends_done(&self) -> bool {
        (self.ctrl_max_seqno.wrapping_sub(self.ctrl_seqno)) + self.sqe_avail == u32::from(self.sizes.sq)
            || self.state & st::CONNECTED == 0
    }

    fn post_send(&self, wr: &mut ibv_send_wr) -> Result<(), c_int> {
        let mut bad = null_mut();
        // SAFETY: the socket's QP; a work request built by the caller with its SGEs alive.
        match unsafe { crate::qp::post_send(self.cm().qp, wr, &mut bad) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    fn post_recv(&self) -> Result<(), c_int> {
        // SAFETY: an all-zero receive work request is valid (no SGEs).
        let mut wr: ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wire::WR_ID_RECV;
        let mut bad = null_mut();
        // SAFETY: the socket's QP.
        match unsafe { crate::qp::post_recv(self.cm().qp, &mut wr, &mut bad) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// An RDMA Write of `sgl` to `addr`, with `imm` as immediate data if given; the work
    /// request ID is the message (`rs_post_write` / `rs_post_write_msg` / `rs_post_msg`).
    fn post_write(
        &self,
        sgl: &mut [ibv_sge],
        wr_msg: u32,
        flags: u32,
        addr: u64,
        rkey: u32,
        imm: bool,
    ) -> Result<(), c_int> {
        // SAFETY: an all-zero send work request is valid.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = u64::from(wr_msg);
        wr.sg_list = if sgl.is_empty() { null_mut() } else { sgl.as_mut_ptr() };
        wr.num_sge = sgl.len() as c_int;
        wr.opcode = if imm { IBV_WR_RDMA_WRITE_WITH_IMM } else { IBV_WR_RDMA_WRITE };
        wr.send_flags = flags;
        wr.imm_data = wr_msg.to_be();
        wr.wr.rdma = ibv_send_wr_rdma { remote_addr: addr, rkey };
        self.post_send(&mut wr)
    }

    /// A message alone: a zero-length write with immediate data.
    fn post_msg(&self, m: u32) -> Result<(), c_int> {
        self.post_write(&mut [], m, 0, 0, 0, true)
    }

    /// Posts a control message (`ctrl::*`), counted against the control entries.
    pub fn post_ctrl(&mut self, c: u32) -> Result<(), c_int> {
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.post_msg(msg(op::CTRL, c))
    }

    /// A keep-alive: a zero-length RDMA Write without immediate data, which the peer's
    /// hardware answers and its program never sees.
    pub fn post_keepalive(&mut self) -> Result<(), c_int> {
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.post_write(&mut [], msg(op::CTRL, ctrl::KEEPALIVE), 0, 0, 0, false)
    }

    /// Writes `len` bytes (`sgl`) to `dest` (`rs_write_data`, `rs_write_direct`,
    /// `rs_write_iomap`), counting them against the send queue, the send buffer and, for a
    /// message, the peer's credits.
    fn write(&mut self, dest: Dest, sgl: &mut [ibv_sge], len: u32, flags: u32) -> Result<(), c_int> {
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= len;
        match dest {
            Dest::Data(mut t) => {
                self.sseq_no = self.sseq_no.wrapping_add(1);
                let (addr, rkey) = (t.addr, t.key);
                // `len` ≤ `t.length`: `fit` sized it by this same copy. The address is the
                // peer's: it wraps, as in librdmacm's C.
                debug_assert!(len <= t.length);
                t.addr = t.addr.wrapping_add(u64::from(len));
                t.length = t.length.saturating_sub(len);
                self.set_target(self.target_sge, t);
                if t.length == 0 {
                    self.target_sge = (self.target_sge + 1) % wire::SGL_SIZE as usize;
                }
                self.post_write(sgl, msg(op::DATA, len), flags, addr, rkey, true)
            }
            Dest::Direct { addr, rkey } => self.post_write(sgl, msg(op::WRITE, len), flags, addr, rkey, false),
            Dest::Iomap { index } => {
                self.sseq_no = self.sseq_no.wrapping_add(1);
                let at = self.remote_iomap.addr.wrapping_add(u64::from(index) * wire::IOMAP_LEN as u64);
                self.post_write(sgl, msg(op::IOMAP_SGL, index), flags, at, self.remote_iomap.key, true)
            }
        }
    }

    /// How much of a `chunk` fits in the send buffer and the peer's current target buffer,
    /// and that buffer's entry, read once: the write goes by this copy ([`Dest::Data`]), which
    /// the peer's later writes into the entry cannot make smaller than what it sized.
    pub fn fit(&self, chunk: u32) -> (u32, RsSge) {
        let t = self.target(self.target_sge);
        (chunk.min(self.sbuf_bytes_avail).min(t.length), t)
    }

    /// Sends `src` (at most what fits: the caller has cut it) to `dest` as one write: inline
    /// from the program's memory when small enough, else through the send buffer.
    pub fn send_some(&mut self, dest: Dest, src: &[u8]) -> Result<(), c_int> {
        let xfer = src.len() as u32;
        if xfer <= u32::from(self.sizes.inline) {
            let mut sge = ibv_sge { addr: src.as_ptr() as u64, length: xfer, lkey: 0 };
            self.write(dest, std::slice::from_mut(&mut sge), xfer, IBV_SEND_INLINE)
        } else {
            self.copy_and_write(dest, |dst, at| dst.copy_from_slice(&src[at..at + dst.len()]), xfer, 0)
        }
    }

    /// Copies `xfer` bytes into the send buffer with `fill(slice, offset into the message)`
    /// (wrapping at its end: then two SGEs) and writes them to `dest`.
    pub fn copy_and_write(
        &mut self,
        dest: Dest,
        mut fill: impl FnMut(&mut [u8], usize),
        xfer: u32,
        flags: u32,
    ) -> Result<(), c_int> {
        let Some(sb) = &self.sbuf else { return Err(libc::ENOTCONN) };
        let (base, lkey, size) = (sb.ptr, sb.lkey(), self.sizes.sbuf);
        let head = self.sbuf_head;
        let first = xfer.min(size - head);
        // SAFETY: `head + first` ≤ the send buffer's size; the bytes between the head and the
        // oldest unfinished write are free (`sbuf_bytes_avail` ≥ xfer).
        fill(unsafe { std::slice::from_raw_parts_mut(base.add(head as usize), first as usize) }, 0);
        let mut sgl = [
            ibv_sge { addr: base as u64 + u64::from(head), length: first, lkey },
            ibv_sge { addr: base as u64, length: xfer - first, lkey },
        ];
        let n = if first < xfer {
            // SAFETY: the wrapped part, from the buffer's start, as above.
            fill(unsafe { std::slice::from_raw_parts_mut(base, (xfer - first) as usize) }, first as usize);
            2
        } else {
            1
        };
        self.sbuf_head = (head + xfer) % size;
        self.write(dest, &mut sgl[..n], xfer, flags)
    }

    /// Whether a mapping the program made waits to be told to the peer (`iomap_pending`).
    pub fn iomap_pending(&self) -> bool {
        self.iomaps.iter().any(|m| m.index.is_some() && !m.sent)
    }

    /// Tells the peer of the next mapping that waits (`rs_send_iomaps`' loop body); the
    /// caller has checked `can_send`.
    pub fn send_next_iomap(&mut self) -> Result<(), c_int> {
        let Some(k) = self.iomaps.iter().position(|m| m.index.is_some() && !m.sent) else { return Ok(()) };
        let m = &mut self.iomaps[k];
        m.sent = true;
        let index = m.index.unwrap_or(0) as u32;
        // SAFETY: the mapping's live MR.
        let (addr, length, key) = unsafe { ((*m.mr).addr as u64, (*m.mr).length as u32, (*m.mr).rkey) };
        let mut e = wire::RsIomap { offset: m.offset, sge: RsSge { addr, key, length } };
        if self.opts & OPT_SWAP_SGL != 0 {
            e = e.swapped();
        }
        let bytes = e.to_bytes();
        self.send_some(Dest::Iomap { index }, &bytes)
    }

    /// `riomap`: registers the program's `len` bytes at `buf` (for the peer to write, with
    /// `writable`, into a slot of its I/O map), under `offset` (-1: the address).
    pub fn map(&mut self, buf: *mut c_void, len: usize, writable: bool, offset: i64) -> Result<i64, c_int> {
        let index = if writable {
            let n = self.remote_iomap.length as usize;
            let free = (0..n).find(|i| !self.iomaps.iter().any(|m| m.index == Some(*i)));
            Some(free.ok_or(libc::ENOMEM)?)
        } else {
            None
        };
        let access = IBV_ACCESS_LOCAL_WRITE | if writable { IBV_ACCESS_REMOTE_WRITE } else { 0 };
        // SAFETY: the id's PD; the program's memory, which the registration checks.
        let mr = unsafe { crate::mem::ibv_reg_mr(self.cm().pd, buf, len, access as c_int) };
        if mr.is_null() {
            return Err(errno());
        }
        let offset = if offset == -1 { buf as i64 } else { offset };
        self.iomaps.push(IoMap { mr, offset: offset as u64, index, sent: false });
        Ok(offset)
    }

    /// `riounmap`: the mapping of exactly that memory, deregistered.
    pub fn unmap(&mut self, buf: *mut c_void, len: usize) -> Result<(), c_int> {
        // SAFETY: the mappings' live MRs.
        let k = self.iomaps.iter().position(|m| unsafe { (*m.mr).addr == buf && (*m.mr).length == len });
        let m = self.iomaps.remove(k.ok_or(libc::EINVAL)?);
        // SAFETY: its MR, deregistered once.
        unsafe { crate::mem::ibv_dereg_mr(m.mr) };
        Ok(())
    }

    /// The entry of this end's I/O map (written by the peer) that covers `offset`.
    pub fn find_iomap(&self, offset: u64) -> Option<wire::RsIomap> {
        let t = self.target.as_ref()?;
        (0..usize::from(self.sizes.iomap)).find_map(|i| {
            let at = wire::SGL_SIZE as usize * std::mem::size_of::<RsSge>() + i * wire::IOMAP_LEN;
            // SAFETY: entry `i` of the I/O map after the SGL in the target region (sized for
            // `iomap` entries in init_bufs); read volatile: the peer writes it.
            let e = unsafe { std::ptr::read_volatile(t.ptr.add(at).cast::<wire::RsIomap>()) };
            // The peer wrote the entry: compared without a sum that could overflow.
            offset.checked_sub(e.offset).is_some_and(|into| into < u64::from(e.sge.length)).then_some(e)
        })
    }

    /// Sends up to `chunk` bytes of `src` into the peer's mapped region `e` at `offset`, which
    /// `e` covers ([`Self::find_iomap`]) (`riowrite`'s loop body); returns how many. The
    /// address is the peer's to state: it wraps, as librdmacm's C does, and the peer's HCA
    /// checks the key's bounds.
    pub fn write_direct(&mut self, e: &wire::RsIomap, offset: u64, src: &[u8], chunk: u32) -> Result<u32, c_int> {
        let into = offset.checked_sub(e.offset).filter(|&i| i < u64::from(e.sge.length)).ok_or(libc::EINVAL)?;
        let room = (u64::from(e.sge.length) - into).min(u64::from(u32::MAX)) as u32;
        let xfer = chunk.min(self.sbuf_bytes_avail).min(room).min(src.len() as u32);
        let dest = Dest::Direct { addr: e.sge.addr.wrapping_add(into), rkey: e.sge.key };
        self.send_some(dest, &src[..xfer as usize])?;
        Ok(xfer)
    }

    /// Gives the peer a buffer half, or credits alone (`rs_send_credits`).
    fn send_credits(&mut self) {
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.rseq_comp = self.rseq_no.wrapping_add(self.sizes.rq >> 1);
        let credits = msg(op::SGL, u32::from(self.rseq_no) + u32::from(self.sizes.rq));
        let half = self.sizes.rbuf >> 1;
        if self.rbuf_bytes_avail >= half {
            let Some(rb) = &self.rbuf else { return };
            let mut sge = RsSge { addr: rb.addr() + u64::from(self.rbuf_free_offset), key: rb.rkey(), length: half };
            if self.opts & OPT_SWAP_SGL != 0 {
                sge = RsSge { addr: sge.addr.swap_bytes(), key: sge.key.swap_bytes(), length: sge.length.swap_bytes() };
            }
            let len = std::mem::size_of::<RsSge>() as u32;
            let mut ib = if u32::from(self.sizes.inline) < len {
                // Through the send buffer's control slots (after its data).
                let Some(sb) = &self.sbuf else { return };
                let slot = self.sizes.sbuf + MAX_CTRL_MSG * (self.ctrl_seqno & (QP_CTRL_SIZE - 1));
                // SAFETY: one of the four control slots past the data, reserved in init_bufs.
                unsafe { std::ptr::write_unaligned(sb.ptr.add(slot as usize).cast::<RsSge>(), sge) };
                (ibv_sge { addr: sb.addr() + u64::from(slot), length: len, lkey: sb.lkey() }, 0)
            } else {
                (ibv_sge { addr: std::ptr::addr_of!(sge) as u64, length: len, lkey: 0 }, IBV_SEND_INLINE)
            };
            // The peer's SGL address wraps, as in librdmacm's C (its HCA checks the key).
            let to = self.remote_sgl.addr.wrapping_add(u64::from(self.remote_sge) * u64::from(len));
            let _ = self.post_write(std::slice::from_mut(&mut ib.0), credits, ib.1, to, self.remote_sgl.key, true);
            self.rbuf_bytes_avail -= half;
            self.rbuf_granted += half;
            self.rbuf_free_offset += half;
            if self.rbuf_free_offset >= self.sizes.rbuf {
                self.rbuf_free_offset = 0;
            }
            // The peer's SGL length may be any: the index wraps as librdmacm's unsigned one.
            self.remote_sge = self.remote_sge.wrapping_add(1);
            if self.remote_sge == self.remote_sgl.length {
                self.remote_sge = 0;
            }
        } else {
            let _ = self.post_msg(credits);
        }
    }

    fn give_credits(&self) -> bool {
        (self.rbuf_bytes_avail >= self.sizes.rbuf >> 1 || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0)
            && self.ctrl_avail()
            && self.state & st::CONNECTED != 0
    }

    pub fn update_credits(&mut self) {
        if self.give_credits() {
            self.send_credits();
        }
    }

    /// Takes every completion (`rs_poll_cq`): received messages into the ring, buffers and
    /// credits, control; sends give their space back. Reposts what was received.
    pub fn poll_cq(&mut self) -> Result<(), c_int> {
        // SAFETY: an all-zero work completion is valid.
        let mut wc: ibv_wc = unsafe { std::mem::zeroed() };
        let mut received = 0u32;
        if self.id.is_null() || self.cq().is_null() {
            return Ok(()); // no connection yet, or one that never got its QP
        }
        loop {
            // SAFETY: the socket's CQ and one writable completion.
            let n = unsafe { crate::cq::poll_cq(self.cq(), 1, &mut wc) };
            if n <= 0 {
                break;
            }
            if wc.wr_id & wire::WR_ID_RECV != 0 {
                if wc.status != 0 {
                    continue;
                }
                received += 1;
                let m = u32::from_be(wc.imm_data);
                match msg_op(m) {
                    op::SGL => self.sseq_comp = msg_data(m) as u16,
                    op::IOMAP_SGL | op::WRITE => {}
                    op::CTRL => match msg_data(m) {
                        ctrl::DISCONNECT => {
                            self.state = st::DISCONNECTED;
                            return Ok(());
                        }
                        ctrl::SHUTDOWN if self.state & st::WRITABLE != 0 => self.state &= !st::READABLE,
                        ctrl::SHUTDOWN => {
                            self.state = st::DISCONNECTED;
                            return Ok(());
                        }
                        _ => {}
                    },
                    o => {
                        // Data: the peer claims that many bytes of what it was offered. More
                        // than that is no data of this connection (reading it would go round
                        // the buffer over bytes not written, or still unread): the peer is
                        // broken, and the socket fails as at an error completion.
                        let len = msg_data(m);
                        let Some(left) = self.rbuf_granted.checked_sub(len) else {
                            self.protocol_error();
                            return Ok(());
                        };
                        self.rbuf_granted = left;
                        self.rmsg[self.rmsg_tail] = (o, len);
                        self.rmsg_tail = (self.rmsg_tail + 1) % self.rmsg.len();
                    }
                }
            } else {
                let m = wc.wr_id as u32;
                match msg_op(m) {
                    op::SGL => self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1),
                    op::CTRL => {
                        self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1);
                        if msg_data(m) == ctrl::DISCONNECT {
                            self.state = st::DISCONNECTED;
                        }
                    }
                    op::IOMAP_SGL => {
                        self.sqe_avail += 1;
                        self.sbuf_bytes_avail += wire::IOMAP_LEN as u32;
                    }
                    _ => {
                        self.sqe_avail += 1;
                        self.sbuf_bytes_avail += msg_data(m);
                    }
                }
                if wc.status != 0 && self.state & st::CONNECTED != 0 {
                    self.state = st::ERROR;
                    self.err = libc::EIO;
                }
            }
        }
        if self.state & st::CONNECTED != 0 {
            for _ in 0..received {
                if let Err(e) = self.post_recv() {
                    self.state = st::ERROR;
                    self.err = e;
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// The peer broke the protocol: the socket fails as at an error completion (`EIO`), and
    /// its QP goes to the error state, so that nothing more of the peer's lands or completes.
    fn protocol_error(&mut self) {
        self.state = st::ERROR;
        self.err = libc::EIO;
        self.flush();
    }

    /// Copies received bytes into `dst` (`rrecv`'s loop; with `peek`, `rs_peek`: nothing is
    /// consumed). Returns how many.
    pub fn read(&mut self, dst: &mut [u8], peek: bool) -> usize {
        let Some(rb) = &self.rbuf else { return 0 };
        let (base, size) = (rb.ptr, self.sizes.rbuf as usize);
        let (mut head, mut offset) = (self.rmsg_head, self.rbuf_offset as usize);
        let mut done = 0;
        while done < dst.len() && head != self.rmsg_tail {
            let left = dst.len() - done;
            let avail = self.rmsg[head].1 as usize;
            let take = if left < avail {
                if !peek {
                    self.rmsg[head].1 -= left as u32;
                }
                left
            } else {
                if !peek {
                    self.rseq_no = self.rseq_no.wrapping_add(1);
                }
                head = (head + 1) % self.rmsg.len();
                avail
            };
            let mut copied = 0;
            while copied < take {
                let n = (take - copied).min(size - offset);
                // SAFETY: `offset + n` ≤ the receive buffer's size; the peer wrote these bytes
                // before the completion that put their message in the ring.
                let src = unsafe { std::slice::from_raw_parts(base.add(offset), n) };
                dst[done + copied..done + copied + n].copy_from_slice(src);
                copied += n;
                offset = (offset + n) % size;
            }
            done += take;
        }
        if !peek {
            self.rmsg_head = head;
            self.rbuf_offset = offset as u32;
            // No overflow: the messages read were within what was granted (`poll_cq`), and
            // the two sum to at most the buffer (see `rbuf_granted`).
            self.rbuf_bytes_avail += done as u32;
        }
        done
    }

    /// Moves the QP to the error state, so that its receives flush (librdmacm's
    /// `ucma_shutdown`): a thread waiting on the CQ wakes.
    pub fn flush(&self) {
        if self.id.is_null() || self.cm().qp.is_null() {
            return;
        }
        // SAFETY: an all-zero attribute structure is valid; the socket's QP.
        unsafe {
            let mut a: ibv_qp_attr = std::mem::zeroed();
            a.qp_state = 6; // IBV_QPS_ERR
            crate::qp::ibv_modify_qp(self.cm().qp, &mut a, IBV_QP_STATE);
        }
    }

    /// Releases the buffers and the QP (with the CQ and channel the id holds).
    pub fn free_ep(&mut self, unacked: u32) {
        if self.id.is_null() {
            return;
        }
        for m in self.iomaps.drain(..) {
            // SAFETY: a mapping's MR, deregistered once.
            unsafe { crate::mem::ibv_dereg_mr(m.mr) };
        }
        self.sbuf = None;
        self.rbuf = None;
        self.target = None;
        let cq = self.cq();
        // SAFETY: the socket's id and CQ; events taken are acknowledged before the CQ goes.
        unsafe {
            if !cq.is_null() && unacked > 0 {
                crate::cq::ibv_ack_cq_events(cq, unacked);
            }
            // The QP, and the CQ and channel in the id's fields (made before a QP that failed).
            crate::rdmacm::qp::softhca_rdma_destroy_qp(self.id);
        }
    }
}

/// A pointer the program gave, as a byte slice (empty for a null or zero-length one).
///
/// # Safety
/// `p` points to `len` readable bytes.
pub(super) unsafe fn bytes<'a>(p: *const c_void, len: usize) -> &'a [u8] {
    if p.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(p.cast(), len) }
}

/// As [`bytes`], writable.
///
/// # Safety
/// `p` points to `len` writable bytes.
pub(super) unsafe fn bytes_mut<'a>(p: *mut c_void, len: usize) -> &'a mut [u8] {
    if p.is_null() || len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(p.cast(), len) }
}
