//! A stream rsocket (`softhca_rs_*`, what `librdmacm.so.1`'s `r*` functions forward to) facing
//! a peer that says what librdmacm never would: the peer here is an rdma_cm client of the
//! drop-in that speaks the rsocket protocol itself (its connection data in the REQ, RDMA
//! Writes with immediate data), so it chooses every address, length and claim the socket
//! reads from it. The peer's addresses are its own (its HCA checks them against its keys):
//! they wrap, as in librdmacm's C, and reach memory the peer registered at such I/O virtual
//! addresses. Release builds check integer overflow: the sums panicked before (on the
//! socket's service thread, which then accepted nothing, or across the C boundary, which
//! aborts the program). A claim of more data than the socket offered breaks the protocol:
//! the socket fails (end of file, `SO_ERROR` EIO); before, it read bytes nobody wrote.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use softhca_ibverbs::abi::*;
use softhca_ibverbs::rdmacm::abi::*;

#[path = "common/rdmacm_ffi.rs"]
mod rdmacm_ffi;
use rdmacm_ffi::*;

#[path = "common/rsocket_ffi.rs"]
mod rsocket_ffi;
use rsocket_ffi::*;

extern "C" {
    fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
    fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;
    fn ibv_reg_mr_iova(pd: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, access: c_int) -> *mut ibv_mr;
    fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
}

const IBV_SEND_SIGNALED: u32 = 1 << 1;
/// The connection data's `RS_CONN_FLAG_IOMAP`.
const CONN_FLAG_IOMAP: u8 = 1 << 1;
/// Message operations (`RS_OP_*`, the top three bits of the immediate data).
const OP_DATA: u32 = 0;
const OP_SGL: u32 = 4;
/// The socket's receive buffer (its default `SO_RCVBUF`) and the half it offers at a time.
const RBUF: u32 = 1 << 17;
const HALF: u32 = RBUF / 2;
/// The peer's receive queue: the credits it gives.
const PEER_RQ: u32 = 8;
const PAGE: usize = 4096;
const TIMEOUT: Duration = Duration::from_secs(20);

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn msg(op: u32, data: u32) -> u32 {
    (op << 29) | (data & 0x1FFF_FFFF)
}

/// `struct rs_sge`, as one end writes it into the other's memory (host order: both ends are
/// this host) and as the connection data carries it (big-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sge {
    addr: u64,
    key: u32,
    length: u32,
}

impl Sge {
    fn of(b: &[u8]) -> Sge {
        Sge {
            addr: u64::from_ne_bytes(b[..8].try_into().unwrap()),
            key: u32::from_ne_bytes(b[8..12].try_into().unwrap()),
            length: u32::from_ne_bytes(b[12..16].try_into().unwrap()),
        }
    }
}

/// `struct rs_conn_data`: version 1, `flags`, the peer's credits, no I/O map entries, its
/// target SGL and the first buffer it offers.
fn conn_data(flags: u8, target_sgl: Sge, data_buf: Sge) -> [u8; 40] {
    let mut b = [0u8; 40];
    b[0] = 1;
    b[1] = flags;
    b[2..4].copy_from_slice(&(PEER_RQ as u16).to_be_bytes());
    for (at, s) in [(8, target_sgl), (24, data_buf)] {
        b[at..at + 8].copy_from_slice(&s.addr.to_be_bytes());
        b[at + 8..at + 12].copy_from_slice(&s.key.to_be_bytes());
        b[at + 12..at + 16].copy_from_slice(&s.length.to_be_bytes());
    }
    b
}

/// The socket's connection data (from the REP): its target SGL and its first buffer.
fn parse_conn_data(b: &[u8]) -> (Sge, Sge) {
    let sge = |at: usize| Sge {
        addr: u64::from_be_bytes(b[at..at + 8].try_into().unwrap()),
        key: u32::from_be_bytes(b[at + 8..at + 12].try_into().unwrap()),
        length: u32::from_be_bytes(b[at + 12..at + 16].try_into().unwrap()),
    };
    (sge(8), sge(24))
}

/// A listening rsocket on 127.0.0.1:`port`.
fn listener(port: u16) -> c_int {
    let a = localhost(port);
    let len = std::mem::size_of_val(&a) as libc::socklen_t;
    // SAFETY: socket calls on a local address.
    unsafe {
        let l = softhca_rs_socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(l >= 0, "rsocket: {}", errno());
        assert_eq!(softhca_rs_bind(l, (&a as *const libc::sockaddr_in).cast(), len), 0, "rbind: {}", errno());
        assert_eq!(softhca_rs_listen(l, 1), 0, "rlisten: {}", errno());
        l
    }
}

/// The forged peer: an RC QP on its own PD and four pages of memory, which it registers
/// where it likes ([`Peer::reg`]).
struct Peer {
    ch: *mut rdma_event_channel,
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    mem: *mut u8,
    mrs: Vec<*mut ibv_mr>,
    /// The source of its writes (the first page).
    src: *mut ibv_mr,
}

impl Peer {
    const PAGES: usize = 4;

    /// A client resolved to 127.0.0.1:`port`, with its QP and its receives posted.
    fn new(port: u16) -> Peer {
        // SAFETY: the library's calls on its own objects and local out pointers; an
        // anonymous mapping of the peer's own.
        unsafe {
            let ch = softhca_rdma_create_event_channel();
            assert!(!ch.is_null());
            let mut id = null_mut();
            assert_eq!(softhca_rdma_create_id(ch, &mut id, null_mut(), RDMA_PS_TCP), 0);
            let mut dst = localhost(port);
            assert_eq!(softhca_rdma_resolve_addr(id, null_mut(), (&raw mut dst).cast(), 2000), 0, "{}", errno());
            expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
            assert_eq!(softhca_rdma_resolve_route(id, 2000), 0);
            expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
            let pd = ibv_alloc_pd((*id).verbs);
            assert!(!pd.is_null());
            let mut attr = rc_init();
            attr.cap.max_send_wr = 8;
            attr.cap.max_recv_wr = PEER_RQ;
            attr.sq_sig_all = 1;
            assert_eq!(softhca_rdma_create_qp(id, pd, &mut attr), 0, "rdma_create_qp: {}", errno());
            let mem = libc::mmap(
                null_mut(),
                Self::PAGES * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(mem, libc::MAP_FAILED);
            let mut p = Peer { ch, id, pd, mem: mem.cast(), mrs: Vec::new(), src: null_mut() };
            p.src = p.reg(0, PAGE, mem as u64);
            for _ in 0..PEER_RQ {
                p.post_recv();
            }
            p
        }
    }

    /// Registers `len` bytes at `offset` into the peer's memory, for remote writes, at the
    /// I/O virtual address `iova` (in the same place of its page).
    fn reg(&mut self, offset: usize, len: usize, iova: u64) -> *mut ibv_mr {
        let access = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) as c_int;
        // SAFETY: the peer's PD and its own mapped memory, which outlives the region.
        let mr = unsafe { ibv_reg_mr_iova(self.pd, self.mem.add(offset).cast(), len, iova, access) };
        assert!(!mr.is_null(), "ibv_reg_mr_iova: {}", errno());
        self.mrs.push(mr);
        mr
    }

    /// The peer's memory at `offset`.
    fn bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        assert!(offset + len <= Self::PAGES * PAGE);
        // SAFETY: within the peer's mapping; volatile, as the device writes it.
        (0..len).map(|i| unsafe { self.mem.add(offset + i).read_volatile() }).collect()
    }

    fn post_recv(&self) {
        // SAFETY: an all-zero receive work request (no SGE) is valid; the peer's QP.
        unsafe {
            let mut wr: ibv_recv_wr = std::mem::zeroed();
            let mut bad = null_mut();
            let qp = (*self.id).qp;
            assert_eq!((*(*qp).context).ops.post_recv.unwrap()(qp, &mut wr, &mut bad), 0);
        }
    }

    /// Connects with `data` as its connection data: the socket's connection data, once the
    /// connection is established; None if it is not within the timeout.
    fn connect(&self, data: [u8; 40]) -> Option<(Sge, Sge)> {
        // SAFETY: an all-zero rdma_conn_param is valid; the peer's id; private data that
        // outlives the call; the event is the library's until acknowledged.
        unsafe {
            let mut p: rdma_conn_param = std::mem::zeroed();
            p.private_data = data.as_ptr().cast();
            p.private_data_len = data.len() as u8;
            p.flow_control = 1;
            p.retry_count = 7;
            p.rnr_retry_count = 7;
            assert_eq!(softhca_rdma_connect(self.id, &mut p), 0, "rdma_connect: {}", errno());
            let mut fd = libc::pollfd { fd: (*self.ch).fd, events: libc::POLLIN, revents: 0 };
            if libc::poll(&mut fd, 1, TIMEOUT.as_millis() as c_int) != 1 {
                return None;
            }
            let mut ev = null_mut();
            assert_eq!(softhca_rdma_get_cm_event(self.ch, &mut ev), 0);
            let c = (*ev).param.conn;
            let got = ((*ev).event == RDMA_CM_EVENT_ESTABLISHED && c.private_data_len >= 40)
                .then(|| parse_conn_data(std::slice::from_raw_parts(c.private_data.cast(), 40)));
            assert_eq!(softhca_rdma_ack_cm_event(ev), 0);
            got
        }
    }

    /// Writes `data` to `to` with `imm` as its immediate data (host order), and waits for
    /// the write to complete.
    fn write(&self, data: &[u8], to: Sge, imm: u32) {
        assert!(data.len() <= PAGE);
        // SAFETY: the peer's first page, its source region; an all-zero send work request is
        // valid; the peer's QP and CQ.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.mem, data.len());
            let mut sge = ibv_sge { addr: self.mem as u64, length: data.len() as u32, lkey: (*self.src).lkey };
            let mut wr: ibv_send_wr = std::mem::zeroed();
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
            wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            wr.send_flags = IBV_SEND_SIGNALED;
            wr.imm_data = imm.to_be();
            wr.wr.rdma = ibv_send_wr_rdma { remote_addr: to.addr, rkey: to.key };
            let mut bad = null_mut();
            let qp = (*self.id).qp;
            assert_eq!((*(*qp).context).ops.post_send.unwrap()(qp, &mut wr, &mut bad), 0);
            let wc = self.poll((*self.id).send_cq).expect("the write completes");
            assert_eq!(wc.status, 0, "the write's completion");
        }
    }

    /// The next message the socket sent (its immediate data, host order).
    fn next_msg(&self) -> u32 {
        // SAFETY: the peer's receive CQ.
        let wc = self.poll(unsafe { (*self.id).recv_cq }).expect("a message from the socket");
        assert_eq!(wc.status, 0, "the receive's completion");
        self.post_recv();
        u32::from_be(wc.imm_data)
    }

    fn poll(&self, cq: *mut ibv_cq) -> Option<ibv_wc> {
        let start = Instant::now();
        // SAFETY: an all-zero completion is valid; the peer's CQ.
        unsafe {
            let mut wc: ibv_wc = std::mem::zeroed();
            while start.elapsed() < TIMEOUT {
                if (*(*cq).context).ops.poll_cq.unwrap()(cq, 1, &mut wc) == 1 {
                    return Some(wc);
                }
                std::thread::yield_now();
            }
        }
        None
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // SAFETY: the peer's own objects, each released once, the QP before its PD and
        // regions, the regions before their memory.
        unsafe {
            softhca_rdma_disconnect(self.id);
            softhca_rdma_destroy_qp(self.id);
            for &mr in &self.mrs {
                ibv_dereg_mr(mr);
            }
            ibv_dealloc_pd(self.pd);
            softhca_rdma_destroy_id(self.id);
            softhca_rdma_destroy_event_channel(self.ch);
            libc::munmap(self.mem.cast(), Self::PAGES * PAGE);
        }
    }
}

fn accept(l: c_int) -> c_int {
    // SAFETY: the listener; no address wanted.
    let s = unsafe { softhca_rs_accept(l, null_mut(), null_mut()) };
    assert!(s >= 0, "raccept: {}", errno());
    s
}

fn recv(s: c_int, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    // SAFETY: a local buffer of `len` bytes.
    let n = unsafe { softhca_rs_recv(s, b.as_mut_ptr().cast(), len, 0) };
    assert!(n >= 0, "rrecv: {}", errno());
    b.truncate(n as usize);
    b
}

fn close(fds: &[c_int]) {
    for &fd in fds {
        // SAFETY: an rsocket, closed once.
        assert_eq!(unsafe { softhca_rs_close(fd) }, 0);
    }
}

/// A peer whose target SGL ends at the top of the 64-bit range, with an I/O map after it:
/// the map's address wraps to 0 (the sum overflowed in the socket's accept, on its service
/// thread, and the connection never came), and the buffer the socket offers lands in the
/// SGL's second entry, the range's last 16 bytes.
#[test]
fn a_peer_sgl_at_the_top_of_the_addresses_with_an_iomap_after_it() {
    let l = listener(7870);
    let mut peer = Peer::new(7870);
    let sgl_at = u64::MAX - 31;
    // The SGL's two entries, where an I/O virtual address ends in its page as the memory does.
    let t = peer.reg(PAGE + PAGE - 32, 32, sgl_at);
    // SAFETY: the peer's live region.
    let sgl = Sge { addr: sgl_at, key: unsafe { (*t).rkey }, length: 2 };
    let buf = peer.reg(2 * PAGE, PAGE, 2 * PAGE as u64);
    // SAFETY: as above.
    let first = Sge { addr: 2 * PAGE as u64, key: unsafe { (*buf).rkey }, length: PAGE as u32 };
    let (_, data_buf) = peer.connect(conn_data(CONN_FLAG_IOMAP, sgl, first)).expect("the socket accepts");
    let s = accept(l);
    peer.write(b"hello", data_buf, msg(OP_DATA, 5));
    assert_eq!(recv(s, 5), b"hello");
    assert_eq!(peer.next_msg() >> 29, OP_SGL, "the socket's second half");
    let offered = Sge { addr: data_buf.addr + u64::from(HALF), key: data_buf.key, length: HALF };
    assert_eq!(Sge::of(&peer.bytes(2 * PAGE - 16, 16)), offered, "in the SGL's second entry");
    close(&[s, l]);
}

/// A peer whose target SGL's second entry is past the top of the 64-bit range: the socket's
/// offer of its second half goes to the wrapped address, 0, where the peer registered memory
/// (the sum overflowed in rrecv, and the program aborted).
#[test]
fn the_offer_of_a_buffer_wraps_past_the_top_of_the_addresses() {
    let l = listener(7871);
    let mut peer = Peer::new(7871);
    let zero = peer.reg(PAGE, 16, 0);
    // SAFETY: the peer's live region.
    let sgl = Sge { addr: u64::MAX - 15, key: unsafe { (*zero).rkey }, length: 2 };
    let buf = peer.reg(2 * PAGE, PAGE, 2 * PAGE as u64);
    // SAFETY: as above.
    let first = Sge { addr: 2 * PAGE as u64, key: unsafe { (*buf).rkey }, length: PAGE as u32 };
    let (_, data_buf) = peer.connect(conn_data(0, sgl, first)).expect("the socket accepts");
    let s = accept(l);
    peer.write(b"hello", data_buf, msg(OP_DATA, 5));
    assert_eq!(recv(s, 5), b"hello");
    assert_eq!(peer.next_msg() >> 29, OP_SGL, "the socket's second half");
    let offered = Sge { addr: data_buf.addr + u64::from(HALF), key: data_buf.key, length: HALF };
    assert_eq!(Sge::of(&peer.bytes(PAGE, 16)), offered, "at address 0");
    close(&[s, l]);
}

/// A peer that offers a buffer ending at the top of the 64-bit range: the socket's data fills
/// it, and the entry's next address wraps to 0 (the sum overflowed in rsend, and the program
/// aborted).
#[test]
fn data_fills_a_buffer_at_the_top_of_the_addresses() {
    let l = listener(7872);
    let mut peer = Peer::new(7872);
    let t = peer.reg(PAGE, 32, PAGE as u64);
    // SAFETY: the peer's live region.
    let sgl = Sge { addr: PAGE as u64, key: unsafe { (*t).rkey }, length: 2 };
    let top = peer.reg(2 * PAGE, PAGE, u64::MAX - (PAGE as u64 - 1));
    // SAFETY: as above.
    let first = Sge { addr: u64::MAX - 99, key: unsafe { (*top).rkey }, length: 100 };
    peer.connect(conn_data(0, sgl, first)).expect("the socket accepts");
    let s = accept(l);
    let data: Vec<u8> = (0..100u8).collect();
    // SAFETY: 100 bytes of a live local.
    assert_eq!(unsafe { softhca_rs_send(s, data.as_ptr().cast(), 100, 0) }, 100, "rsend: {}", errno());
    loop {
        let m = peer.next_msg();
        if m >> 29 == OP_DATA {
            assert_eq!(m, msg(OP_DATA, 100));
            break;
        }
    }
    assert_eq!(peer.bytes(3 * PAGE - 100, 100), data, "the buffer's bytes, up to the top");
    close(&[s, l]);
}

/// A peer that claims more data than the socket offered it: the socket fails, as at an
/// error completion (end of file, `SO_ERROR` EIO), and nothing beyond what was claimed
/// within the offers is read (before, the socket read round its buffer, bytes nobody wrote).
#[test]
fn a_claim_beyond_the_buffers_offered_fails_the_socket() {
    let l = listener(7873);
    let mut peer = Peer::new(7873);
    let t = peer.reg(PAGE, 32, PAGE as u64);
    // SAFETY: the peer's live region.
    let sgl = Sge { addr: PAGE as u64, key: unsafe { (*t).rkey }, length: 2 };
    let buf = peer.reg(2 * PAGE, PAGE, 2 * PAGE as u64);
    // SAFETY: as above.
    let first = Sge { addr: 2 * PAGE as u64, key: unsafe { (*buf).rkey }, length: PAGE as u32 };
    let (_, data_buf) = peer.connect(conn_data(0, sgl, first)).expect("the socket accepts");
    let s = accept(l);
    assert_eq!(data_buf.length, HALF);
    peer.write(b"hello", data_buf, msg(OP_DATA, 5));
    assert_eq!(recv(s, 5), b"hello");
    // Both halves are offered now, 5 bytes of them written: one byte more is claimed.
    assert_eq!(peer.next_msg() >> 29, OP_SGL, "the socket's second half");
    let next = Sge { addr: data_buf.addr + 5, ..data_buf };
    peer.write(b"x", next, msg(OP_DATA, RBUF - 5 + 1));
    let got = recv(s, 2 * RBUF as usize);
    assert!(got.is_empty(), "end of file, not {} bytes", got.len());
    let (mut e, mut len): (c_int, libc::socklen_t) = (0, 4);
    // SAFETY: an int option into a live local.
    let r = unsafe { softhca_rs_getsockopt(s, libc::SOL_SOCKET, libc::SO_ERROR, (&raw mut e).cast(), &mut len) };
    assert_eq!((r, e), (0, libc::EIO));
    close(&[s, l]);
}
