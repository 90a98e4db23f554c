//! The work-request builder of `struct ibv_qp_ex` (`ibv_wr_start`, `ibv_wr_send`, …,
//! `ibv_wr_set_sge`, `ibv_wr_complete`, `ibv_wr_abort`), which UCX, libfabric's verbs
//! provider, perftest and the rdma-core tests post through.
//!
//! Between `ibv_wr_start` and `ibv_wr_complete` each operation call begins a work request
//! with the QP's `wr_id` and `wr_flags` of the moment, and the setters after it fill its
//! address, gather list or inline data. The requests are kept in a [`Batch`] on the QP whose
//! slots are reused (no allocation once warm), and `ibv_wr_complete` hands them to the core's
//! Post Send as one list: all of them are posted or none, as a provider rolls its queue back
//! when a request in the batch was bad. A setter given something the QP cannot take (too many
//! SGEs, too much inline data) marks the batch, and `ibv_wr_complete` returns that error.

use std::ffi::{c_int, c_void};

use softhca::{Access, PostError, QpType, SendFlags, SendWr, Sge, WrOpcode};

use crate::abi::*;
use crate::mem::{Ah, Mr, Mw};
use crate::qp::{qp, MAX_INLINE, MAX_SGE};

/// One work request under construction.
pub(crate) struct Pending {
    wr_id: u64,
    opcode: WrOpcode,
    flags: SendFlags,
    remote_addr: u64,
    rkey: u32,
    compare_add: u64,
    swap: u64,
    /// Host order (the program passes it in network order).
    imm_data: u32,
    sges: [Sge; MAX_SGE],
    num_sge: usize,
    inline: Vec<u8>,
    ah: *const Ah,
    remote_qpn: u32,
    remote_qkey: u32,
    /// XRC: the SRQ at the target (`ibv_wr_set_xrc_srqn`).
    xrc_srqn: u32,
    /// A Bind MW: the window, the R_Key it gets and what it binds.
    bind: Option<(*mut ibv_mw, u32, *const Mr, u64, u64, Access)>,
}

impl Default for Pending {
    fn default() -> Self {
        Pending {
            wr_id: 0,
            opcode: WrOpcode::Send,
            flags: SendFlags::empty(),
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            imm_data: 0,
            sges: [Sge::default(); MAX_SGE],
            num_sge: 0,
            inline: Vec::new(),
            ah: std::ptr::null(),
            remote_qpn: 0,
            remote_qkey: 0,
            xrc_srqn: 0,
            bind: None,
        }
    }
}

/// The requests between `ibv_wr_start` and `ibv_wr_complete`/`ibv_wr_abort`.
#[derive(Default)]
pub(crate) struct Batch {
    /// Slots, the first `len` in use; later ones keep their buffers for reuse.
    wrs: Vec<Pending>,
    len: usize,
    /// The first error a builder call met (0: none).
    err: c_int,
}

// SAFETY: the raw pointers are C objects the program keeps alive until the batch is posted
// or aborted; the batch is only reached under the QP's mutex.
unsafe impl Send for Batch {}

impl Batch {
    fn reset(&mut self) {
        self.len = 0;
        self.err = 0;
    }

    /// The request the setters apply to.
    fn last(&mut self) -> Option<&mut Pending> {
        self.len.checked_sub(1).map(|i| &mut self.wrs[i])
    }
}

/// Runs `f` on the QP's batch.
///
/// # Safety
/// `q` is a live QP of this library.
unsafe fn with_batch<R>(q: *mut ibv_qp_ex, f: impl FnOnce(&mut Batch) -> R) -> R {
    // SAFETY: as the caller promises (an ibv_qp_ex is the start of the Qp).
    let x = unsafe { qp(q.cast()) };
    f(&mut x.batch.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Begins a work request of `opcode` with the QP's current `wr_id` and `wr_flags`, then
/// lets `fill` set its operation's fields.
///
/// # Safety
/// `q` is a live QP of this library.
unsafe fn begin(q: *mut ibv_qp_ex, opcode: WrOpcode, fill: impl FnOnce(&mut Pending)) {
    // SAFETY: the program's fields of its QP, read in place.
    let (wr_id, wr_flags) =
        unsafe { (std::ptr::addr_of!((*q).wr_id).read(), std::ptr::addr_of!((*q).wr_flags).read()) };
    // SAFETY: as the caller promises.
    unsafe {
        with_batch(q, |b| {
            if b.len == b.wrs.len() {
                b.wrs.push(Pending::default());
            }
            let p = &mut b.wrs[b.len];
            b.len += 1;
            let inline = std::mem::take(&mut p.inline);
            *p = Pending { inline, ..Pending::default() };
            p.inline.clear();
            p.wr_id = wr_id;
            p.opcode = opcode;
            p.flags = SendFlags::from_bits_truncate(wr_flags);
            fill(p);
        })
    }
}

/// Enters the QP's critical section (another thread's batch waits for this one's end).
unsafe extern "C" fn wr_start(q: *mut ibv_qp_ex) {
    // SAFETY: a live QP.
    unsafe { qp(q.cast()) }.builder.enter();
    // SAFETY: a live QP.
    unsafe { with_batch(q, Batch::reset) }
}

unsafe extern "C" fn wr_abort(q: *mut ibv_qp_ex) {
    // SAFETY: a live QP.
    unsafe { with_batch(q, Batch::reset) };
    // SAFETY: a live QP.
    unsafe { qp(q.cast()) }.builder.leave();
}

unsafe extern "C" fn wr_send(q: *mut ibv_qp_ex) {
    // SAFETY: a live QP.
    unsafe { begin(q, WrOpcode::Send, |_| {}) }
}

unsafe extern "C" fn wr_send_inv(q: *mut ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: a live QP.
    unsafe { begin(q, WrOpcode::SendWithInv, |p| p.imm_data = invalidate_rkey) }
}

unsafe extern "C" fn wr_local_inv(q: *mut ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: a live QP.
    unsafe { begin(q, WrOpcode::LocalInv, |p| p.imm_data = invalidate_rkey) }
}

unsafe extern "C" fn wr_send_imm(q: *mut ibv_qp_ex, imm_data: u32) {
    // SAFETY: a live QP.
    unsafe { begin(q, WrOpcode::SendWithImm, |p| p.imm_data = u32::from_be(imm_data)) }
}

unsafe extern "C" fn wr_rdma_write(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: a live QP.
    unsafe {
        begin(q, WrOpcode::RdmaWrite, |p| {
            p.rkey = rkey;
            p.remote_addr = remote_addr;
        })
    }
}

unsafe extern "C" fn wr_rdma_write_imm(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm_data: u32) {
    // SAFETY: a live QP.
    unsafe {
        begin(q, WrOpcode::RdmaWriteWithImm, |p| {
            p.rkey = rkey;
            p.remote_addr = remote_addr;
            p.imm_data = u32::from_be(imm_data);
        })
    }
}

unsafe extern "C" fn wr_rdma_read(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: a live QP.
    unsafe {
        begin(q, WrOpcode::RdmaRead, |p| {
            p.rkey = rkey;
            p.remote_addr = remote_addr;
        })
    }
}

unsafe extern "C" fn wr_atomic_cmp_swp(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, compare: u64, swap: u64) {
    // SAFETY: a live QP.
    unsafe {
        begin(q, WrOpcode::AtomicCmpSwp, |p| {
            p.rkey = rkey;
            p.remote_addr = remote_addr;
            p.compare_add = compare;
            p.swap = swap;
        })
    }
}

unsafe extern "C" fn wr_atomic_fetch_add(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64) {
    // SAFETY: a live QP.
    unsafe {
        begin(q, WrOpcode::AtomicFetchAdd, |p| {
            p.rkey = rkey;
            p.remote_addr = remote_addr;
            p.compare_add = add;
        })
    }
}

/// An Atomic Write of the 8 bytes at `atomic_wr`, copied now (as rxe's provider copies them
/// into its WQE): they ride in the request, whatever the QP's `max_inline_data`.
unsafe extern "C" fn wr_atomic_write(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, atomic_wr: *const c_void) {
    // SAFETY: 8 readable bytes, as libibverbs' contract says, or null (refused).
    let data = unsafe { atomic_wr.cast::<[u8; 8]>().as_ref() }.copied();
    // SAFETY: a live QP.
    unsafe {
        begin(q, WrOpcode::AtomicWrite, |p| {
            p.rkey = rkey;
            p.remote_addr = remote_addr;
            p.flags |= SendFlags::INLINE;
            p.inline.extend_from_slice(&data.unwrap_or_default());
        })
    }
    if data.is_none() {
        // SAFETY: a live QP.
        unsafe { fail_batch(q, libc::EINVAL) };
    }
}

/// Binds a window (type 1 or 2): `rkey` is the R_Key it is to carry afterwards (the program's
/// `ibv_inc_rkey` of the one it had); `mw->rkey` is left as it is, as rxe's and mlx5's
/// providers leave it (the program keeps the key it chose). A
/// zero-length bind unbinds a type 1 window (no region needed); zero-based windows are not
/// supported (EINVAL at `ibv_wr_complete`, as a region without one and a length).
unsafe extern "C" fn wr_bind_mw(q: *mut ibv_qp_ex, mw: *mut ibv_mw, rkey: u32, info: *const ibv_mw_bind_info) {
    // SAFETY: a readable bind description, as libibverbs' contract says.
    let info = unsafe { info.as_ref() };
    let err = match info {
        None => libc::EINVAL,
        Some(i) if mw.is_null() || (i.mr.is_null() && i.length != 0) => libc::EINVAL,
        Some(i) if i.mw_access_flags & IBV_ACCESS_ZERO_BASED != 0 => libc::EINVAL,
        Some(_) => 0,
    };
    // SAFETY: a live QP.
    unsafe {
        begin(q, WrOpcode::BindMw, |p| {
            if let (0, Some(i)) = (err, info) {
                let access = Access::from_bits_truncate(i.mw_access_flags) & Access::REMOTE;
                p.bind = Some((mw, rkey, i.mr as *const Mr, i.addr, i.length, access));
            }
        })
    };
    if err != 0 {
        // SAFETY: a live QP.
        unsafe { fail_batch(q, err) };
    }
}

/// Marks the batch failed with `err` (the first error wins).
///
/// # Safety
/// `q` is a live QP of this library.
unsafe fn fail_batch(q: *mut ibv_qp_ex, err: c_int) {
    // SAFETY: as the caller promises.
    unsafe {
        with_batch(q, |b| {
            if b.err == 0 {
                b.err = err;
            }
        })
    }
}

/// Applies `f` to the request being built; a setter with no request before it marks the
/// batch EINVAL.
///
/// # Safety
/// `q` is a live QP of this library.
unsafe fn set(q: *mut ibv_qp_ex, f: impl FnOnce(&mut Pending) -> c_int) {
    // SAFETY: as the caller promises.
    unsafe {
        with_batch(q, |b| {
            let r = b.last().map_or(libc::EINVAL, f);
            if r != 0 && b.err == 0 {
                b.err = r;
            }
        })
    }
}

unsafe extern "C" fn wr_set_ud_addr(q: *mut ibv_qp_ex, ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32) {
    // SAFETY: a live QP.
    unsafe {
        set(q, |p| {
            p.ah = ah as *const Ah;
            p.remote_qpn = remote_qpn;
            p.remote_qkey = remote_qkey;
            0
        })
    }
}

unsafe extern "C" fn wr_set_xrc_srqn(q: *mut ibv_qp_ex, remote_srqn: u32) {
    // SAFETY: a live QP.
    unsafe {
        set(q, |p| {
            p.xrc_srqn = remote_srqn;
            0
        })
    }
}

unsafe extern "C" fn wr_set_sge(q: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: a live QP.
    unsafe {
        set(q, |p| {
            p.sges[0] = Sge { addr, length, lkey };
            p.num_sge = 1;
            p.flags.remove(SendFlags::INLINE);
            0
        })
    }
}

unsafe extern "C" fn wr_set_sge_list(q: *mut ibv_qp_ex, num_sge: usize, list: *const ibv_sge) {
    // SAFETY: a live QP.
    let max = unsafe { qp(q.cast()) }.max_send_sge.min(MAX_SGE);
    let fill = |p: &mut Pending| {
        // Before any entry is read (see `Qp::max_send_sge`); ENOMEM at the batch's
        // ibv_wr_complete, as mlx5's builder answers (rxe's: ENOSPC).
        if num_sge > max {
            return libc::ENOMEM;
        }
        for (k, o) in p.sges[..num_sge].iter_mut().enumerate() {
            // SAFETY: the program's list of `num_sge` SGEs.
            let s = unsafe { *list.add(k) };
            *o = Sge { addr: s.addr, length: s.length, lkey: s.lkey };
        }
        p.num_sge = num_sge;
        p.flags.remove(SendFlags::INLINE);
        0
    };
    // SAFETY: a live QP.
    unsafe { set(q, fill) }
}

/// Copies inline data now (the program may reuse its buffer as soon as the call returns).
///
/// # Safety
/// Each buffer names `length` readable bytes.
unsafe fn set_inline(q: *mut ibv_qp_ex, bufs: impl Iterator<Item = (*const u8, usize)>) {
    // SAFETY: a live QP.
    let max = unsafe { qp(q.cast()) }.max_inline.min(MAX_INLINE);
    let fill = |p: &mut Pending| {
        p.inline.clear();
        for (addr, len) in bufs {
            // Past the QP's max_inline_data: ENOMEM at ibv_wr_complete, as mlx5's builder
            // answers (rxe's: ENOSPC). Never past `max` so far, so this cannot wrap (a sum
            // could: a huge length after a non-empty buffer).
            if len > max - p.inline.len() {
                return libc::ENOMEM;
            }
            if len == 0 {
                continue; // may come with a null address, which no slice may have
            }
            // SAFETY: as the caller promises.
            p.inline.extend_from_slice(unsafe { std::slice::from_raw_parts(addr, len) });
        }
        p.flags.insert(SendFlags::INLINE);
        p.num_sge = 0;
        0
    };
    // SAFETY: a live QP.
    unsafe { set(q, fill) }
}

unsafe extern "C" fn wr_set_inline_data(q: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    // SAFETY: `length` readable bytes at `addr`.
    unsafe { set_inline(q, std::iter::once((addr as *const u8, length))) }
}

unsafe extern "C" fn wr_set_inline_data_list(q: *mut ibv_qp_ex, num_buf: usize, list: *const ibv_data_buf) {
    // SAFETY: the program's list of `num_buf` buffers, each readable.
    unsafe {
        set_inline(
            q,
            (0..num_buf).map(|k| {
                let b = *list.add(k);
                (b.addr as *const u8, b.length)
            }),
        )
    }
}

/// Posts the batch as one list: 0, or the error of the first bad request (none posted); then
/// leaves the critical section `ibv_wr_start` entered.
unsafe extern "C" fn wr_complete(q: *mut ibv_qp_ex) -> c_int {
    // SAFETY: a live QP.
    let x = unsafe { qp(q.cast()) };
    // SAFETY: as above.
    let r = unsafe { post_batch(x) };
    x.builder.leave();
    r
}

/// The core's work request for one built request.
///
/// # Safety
/// Its window, region and address handle are live objects of this library.
unsafe fn send_wr(p: &Pending, ud: bool) -> Result<SendWr<'_>, c_int> {
    if let Some((mw, rkey, mr, addr, length, access)) = p.bind {
        // SAFETY: a live window and region of this library, as the program promises.
        let (w, r) = unsafe { (&*(mw as *const Mw), mr.as_ref()) };
        let bind = match r {
            Some(r) if length != 0 => SendWr::bind_mw(p.wr_id, &w.mw, &r.region(), addr, length, access),
            _ => SendWr::unbind_mw(p.wr_id, &w.mw),
        };
        let mut bind = bind.new_key(rkey as u8);
        bind.send_flags = p.flags;
        return Ok(bind);
    }
    let mut wr = SendWr {
        wr_id: p.wr_id,
        opcode: p.opcode,
        send_flags: p.flags,
        sg_list: &p.sges[..p.num_sge],
        inline_data: &p.inline,
        imm_data: p.imm_data,
        remote_addr: p.remote_addr,
        rkey: p.rkey,
        compare_add: p.compare_add,
        swap: p.swap,
        xrc_srqn: p.xrc_srqn,
        ..SendWr::default()
    };
    if matches!(p.opcode, WrOpcode::SendWithInv | WrOpcode::LocalInv) {
        wr.invalidate_rkey = p.imm_data; // the union libibverbs' imm_data shares
        wr.imm_data = 0;
    }
    if ud {
        if p.ah.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a live AH from ibv_create_ah, kept by the program until completion.
        wr.ah = Some(&unsafe { &*p.ah }.ah);
        wr.remote_qpn = p.remote_qpn;
        wr.remote_qkey = p.remote_qkey;
    }
    Ok(wr)
}

/// The most requests of one batch [`post_batch`] builds without allocating.
const STACK_BATCH: usize = 16;

/// Posts the QP's batch and empties it.
///
/// # Safety
/// The batch's raw pointers are live objects of this library (the program's promise).
unsafe fn post_batch(x: &crate::qp::Qp) -> c_int {
    let mut b = x.batch.lock().unwrap_or_else(|e| e.into_inner());
    let err = b.err;
    let len = b.len;
    b.reset();
    if err != 0 {
        return err;
    }
    let pending = &b.wrs[..len];
    let ud = x.qp.qp_type() == QpType::Ud;
    // A batch of up to STACK_BATCH requests is built on the stack: no allocation per post.
    let mut stack: [SendWr<'_>; STACK_BATCH] = std::array::from_fn(|_| SendWr::default());
    let heap: Vec<SendWr<'_>>;
    let wrs: &[SendWr<'_>] = if len <= STACK_BATCH {
        for (slot, p) in stack.iter_mut().zip(pending) {
            // SAFETY: as the caller promises.
            *slot = match unsafe { send_wr(p, ud) } {
                Ok(wr) => wr,
                Err(e) => return e,
            };
        }
        &stack[..len]
    } else {
        // SAFETY: as the caller promises.
        heap = match pending.iter().map(|p| unsafe { send_wr(p, ud) }).collect() {
            Ok(v) => v,
            Err(e) => return e,
        };
        &heap
    };
    x.qp.post_send(wrs).map_or_else(|PostError { error, .. }| crate::errno_of(&error), |()| 0)
}

/// The `ibv_qp_ex` of a new QP: `qp_base` and the builder entries for its service type
/// (an operation the type cannot post is left NULL, as providers leave it).
pub(crate) fn qp_ex(qp_base: ibv_qp, qp_type: QpType) -> ibv_qp_ex {
    // An XRC initiator posts what RC does, each request naming its SRQ.
    let rc = matches!(qp_type, QpType::Rc | QpType::XrcSend);
    let connected = matches!(qp_type, QpType::Rc | QpType::Uc | QpType::XrcSend);
    ibv_qp_ex {
        qp_base,
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        wr_atomic_cmp_swp: rc.then_some(wr_atomic_cmp_swp),
        wr_atomic_fetch_add: rc.then_some(wr_atomic_fetch_add),
        wr_bind_mw: connected.then_some(wr_bind_mw),
        wr_local_inv: connected.then_some(wr_local_inv),
        wr_rdma_read: rc.then_some(wr_rdma_read),
        wr_rdma_write: connected.then_some(wr_rdma_write),
        wr_rdma_write_imm: connected.then_some(wr_rdma_write_imm),
        wr_send: Some(wr_send),
        wr_send_imm: Some(wr_send_imm),
        wr_send_inv: rc.then_some(wr_send_inv),
        wr_send_tso: std::ptr::null_mut(),
        wr_set_ud_addr: (qp_type == QpType::Ud).then_some(wr_set_ud_addr),
        wr_set_xrc_srqn: (qp_type == QpType::XrcSend).then_some(wr_set_xrc_srqn),
        wr_set_inline_data: Some(wr_set_inline_data),
        wr_set_inline_data_list: Some(wr_set_inline_data_list),
        wr_set_sge: Some(wr_set_sge),
        wr_set_sge_list: Some(wr_set_sge_list),
        wr_start: Some(wr_start),
        wr_complete: Some(wr_complete),
        wr_abort: Some(wr_abort),
        wr_atomic_write: (qp_type == QpType::Rc).then_some(wr_atomic_write),
    }
}
