//! Queue pairs and shared receive queues: create (also `ibv_create_qp_ex`), modify, query,
//! destroy, and posting through `ibv_post_send`/`ibv_post_recv`. Every QP is laid out as an
//! `ibv_qp_ex`; the `ibv_wr_*` builder behind it is [`crate::wr`], which posts through the
//! same ring.

use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::ptr::null_mut;
use std::sync::OnceLock;

use softhca::{
    Access, AddressVector, AltPath, MigState, Mtu, PostError, Qp as SoftQp, QpAttr, QpCap, QpInitAttr, QpState, QpType,
    RecvWr, SendFlags, SendWr, Sge, Srq as SoftSrq, SrqInitAttr, WqSizes, WrOpcode,
};

use crate::abi::*;
use crate::context::{ctx, wait_for_acks};
use crate::cq::cq;
use crate::mem::{ah_attr_of, c_ah_attr, pd, resolve_ah_attr, Ah, Mr, Mw};
use crate::{command, errno_of, fail};

#[repr(C)]
pub(crate) struct Qp {
    pub(crate) ibv: ibv_qp_ex,
    pub(crate) qp: SoftQp,
    sq_sig_all: bool,
    /// The gather and scatter lists' limits it was created with (fixed for its life): a
    /// longer list is EINVAL before any of its entries is read, as rxe's provider checks.
    pub(crate) max_send_sge: usize,
    max_recv_sge: usize,
    /// The inline data it takes (`max_inline_data`, fixed for its life).
    pub(crate) max_inline: usize,
    /// The access flags the program last set, which Query QP gives back as rxe does (the
    /// core keeps only the inbound enables that apply).
    access_flags: std::sync::atomic::AtomicI32,
    /// What `ibv_set_ece` kept (crate::ece).
    pub(crate) ece: std::sync::Mutex<Option<crate::abi::ibv_ece>>,
    /// Whether it was created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` (`ibv_qp_to_qp_ex`
    /// hands out its `ibv_qp_ex` only then, as libibverbs does).
    pub(crate) extended: bool,
    /// The work requests `ibv_wr_*` are building ([`crate::wr`]).
    pub(crate) batch: std::sync::Mutex<crate::wr::Batch>,
    /// Held from `ibv_wr_start` to `ibv_wr_complete`/`ibv_wr_abort` ([`crate::wr`]).
    pub(crate) builder: crate::Gate,
    /// An XRC target QP's domain handle, which it holds until destroyed (else null).
    xrcd: *mut ibv_xrcd,
}

#[repr(C)]
struct Srq {
    ibv: ibv_srq,
    srq: SoftSrq,
    /// Its scatter lists' limit (see `Qp::max_recv_sge`).
    max_sge: usize,
    /// An XRC SRQ's domain handle, which it holds until destroyed (else null).
    xrcd: *mut ibv_xrcd,
}

/// # Safety
/// `q` comes from [`ibv_create_qp`] and is not destroyed.
pub(crate) unsafe fn qp<'a>(q: *mut ibv_qp) -> &'a Qp {
    // SAFETY: `ibv` is the first field of the repr(C) Qp the pointer was made from.
    unsafe { &*(q as *const Qp) }
}

fn qp_state_code(s: QpState) -> c_int {
    s as c_int
}

fn qp_state_of(code: c_int) -> Option<QpState> {
    Some(match code {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Error,
        _ => return None,
    })
}

fn qp_type_of(code: c_int) -> Option<QpType> {
    Some(match code {
        IBV_QPT_RC => QpType::Rc,
        IBV_QPT_UC => QpType::Uc,
        IBV_QPT_UD => QpType::Ud,
        // A Raw Packet QP sends and receives whole Ethernet frames: IBA's Raw Ethertype QP
        // on a RoCE port.
        IBV_QPT_RAW_PACKET => QpType::RawEthertype,
        IBV_QPT_XRC_SEND => QpType::XrcSend,
        IBV_QPT_XRC_RECV => QpType::XrcRecv,
        _ => return None,
    })
}

fn cap_of(c: &ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// Linux rxe sizes a send WQE for the larger of the SGEs and the inline bytes asked for, and
/// reports what that size holds of both: `max(16 x max_send_sge, max_inline_data)` inline
/// bytes and a sixteenth of it in SGEs (1 SGE gives 16 inline bytes; 64 inline bytes give 4
/// SGEs). Programs count on it: rdma_xclient posts 16 inline bytes on a QP that asked for
/// none. A request beyond the device's limits is left for Create QP to refuse.
fn send_wqe_caps(c: &mut QpCap, max_sge: u32, max_inline: u32) {
    const SGE_BYTES: u32 = 16; // struct ibv_sge
    if c.max_send_sge > max_sge || c.max_inline_data > max_inline {
        return;
    }
    let wqe = (c.max_send_sge * SGE_BYTES).max(c.max_inline_data);
    c.max_send_sge = wqe / SGE_BYTES;
    c.max_inline_data = wqe;
}

fn c_cap(c: &QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// What both Create QP entries take from the program.
struct CreateQp<'a> {
    qp_context: *mut c_void,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    cap: &'a mut ibv_qp_cap,
    qp_type: c_int,
    sq_sig_all: c_int,
    /// `IBV_QP_EX_WITH_*`, for a QP created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
    send_ops: Option<u64>,
}

/// The `IBV_QP_EX_WITH_*` operations each service type posts: windows (type 1 and 2) are bound
/// through `ibv_wr_bind_mw`, Local Invalidate goes where a bind goes, Send with Invalidate is
/// RC only, and Atomic Write RC only (its one opcode), as rxe's provider.
fn send_ops_of(qp_type: QpType) -> u64 {
    let uc = IBV_QP_EX_WITH_RDMA_WRITE
        | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
        | IBV_QP_EX_WITH_SEND
        | IBV_QP_EX_WITH_SEND_WITH_IMM
        | IBV_QP_EX_WITH_BIND_MW
        | IBV_QP_EX_WITH_LOCAL_INV;
    match qp_type {
        QpType::Rc | QpType::XrcSend => {
            let rc_only = if qp_type == QpType::Rc { IBV_QP_EX_WITH_ATOMIC_WRITE } else { 0 };
            uc | IBV_QP_EX_WITH_RDMA_READ
                | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
                | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
                | IBV_QP_EX_WITH_SEND_WITH_INV
                | rc_only
        }
        QpType::Uc => uc,
        // Raw: Send only (a Send with Immediate is an immediate error, WR-SQ-6).
        QpType::RawEthertype => IBV_QP_EX_WITH_SEND,
        _ => IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM,
    }
}

/// Creates a QP on `p`.
///
/// # Safety
/// `p` is a live PD; the CQs and SRQ in `a` are live objects of its context (or null).
unsafe fn create(p: *mut ibv_pd, mut a: CreateQp<'_>) -> *mut ibv_qp {
    // SAFETY: a live PD.
    let pd = unsafe { pd(p) };
    // The kernel's Create QP knows the XRC and driver types (EOPNOTSUPP from a device
    // without them) and refuses any other number with EINVAL.
    let Some(qp_type) = qp_type_of(a.qp_type) else {
        let known = a.qp_type == IBV_QPT_DRIVER;
        return fail(if known { libc::EOPNOTSUPP } else { libc::EINVAL });
    };
    // An XRC target is made in its domain (`ibv_create_qp_ex` with IBV_QP_INIT_ATTR_XRCD):
    // the kernel takes a PD's handle here for a domain's and finds none (EINVAL).
    if qp_type == QpType::XrcRecv {
        return fail(libc::EINVAL);
    }
    // An XRC initiator has no receive side: its receive CQ and SRQ are not looked at, and its
    // receive sizes are 0 (libibverbs' `ibv_cmd_create_qp_ex2`, the kernel's create_qp); the
    // `ibv_qp` names what the program gave all the same, as libibverbs' `set_qp` fills it.
    let given = (a.recv_cq, a.srq);
    if qp_type == QpType::XrcSend {
        (a.recv_cq, a.srq, a.cap.max_recv_wr, a.cap.max_recv_sge) = (a.send_cq, null_mut(), 0, 0);
    }
    if a.send_cq.is_null() || a.recv_cq.is_null() {
        return fail(libc::EINVAL);
    }
    if a.send_ops.is_some_and(|ops| ops & !send_ops_of(qp_type) != 0) {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: live CQs (and SRQ) of this library.
    let (scq, rcq) = unsafe { (cq(a.send_cq), cq(a.recv_cq)) };
    // SAFETY: as above; only the context field is read.
    let srq_context = (!a.srq.is_null()).then(|| unsafe { (*a.srq).context });
    // The kernel looks each handle up in the PD's context: another context's CQ or SRQ is
    // not found there (EINVAL), though both contexts share the device here.
    let here = pd.ibv.context;
    if scq.ibv.base.context != here || rcq.ibv.base.context != here || srq_context.is_some_and(|c| c != here) {
        return fail(libc::EINVAL);
    }
    let mut init = QpInitAttr::new(qp_type, &scq.cq, &rcq.cq);
    init.cap = cap_of(a.cap);
    // SAFETY: the PD's context is open.
    if let Ok(d) = unsafe { ctx(here) }.ctx.query_device() {
        send_wqe_caps(&mut init.cap, d.max_sge, d.max_inline_data);
    }
    init.sq_sig_all = a.sq_sig_all != 0;
    if !a.srq.is_null() {
        // SAFETY: a live SRQ.
        init.srq = Some(unsafe { &*(a.srq as *const Srq) }.srq.clone());
    }
    let soft = match pd.pd.create_qp(&init) {
        Ok(q) => q,
        // A Raw Packet QP without a packet socket (no CAP_NET_RAW): EPERM, as the kernel
        // answers an unprivileged process.
        Err(softhca::VerbsError::InvalidServiceType(_)) if qp_type == QpType::RawEthertype => return fail(libc::EPERM),
        Err(e) => return fail(errno_of(&e)),
    };
    let (mut max_send_sge, mut max_recv_sge, mut max_inline) = (MAX_SGE, MAX_SGE, MAX_INLINE);
    if let Ok(q) = soft.query() {
        *a.cap = c_cap(&q.cap);
        (max_send_sge, max_recv_sge) = (q.cap.max_send_sge as usize, q.cap.max_recv_sge as usize);
        max_inline = q.cap.max_inline_data as usize;
    }
    let (recv_cq, srq) = given;
    let ends = QpEnds { context: pd.ibv.context, pd: p, send_cq: a.send_cq, recv_cq, srq, xrcd: null_mut() };
    // SAFETY: the PD's context is open.
    let q = unsafe { new_qp(soft, &a, ends, (max_send_sge, max_recv_sge, max_inline)) };
    if !q.is_null() {
        // SAFETY: the live PD (a parent domain counts its QPs).
        unsafe { crate::domain::hold(p) };
    }
    q
}

/// The objects a new `ibv_qp` names (null where its type has none).
struct QpEnds {
    context: *mut ibv_context,
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    xrcd: *mut ibv_xrcd,
}

/// The program's `ibv_qp` for `soft`, registered with its context.
///
/// # Safety
/// `ends.context` is an open context of this library.
unsafe fn new_qp(soft: SoftQp, a: &CreateQp<'_>, ends: QpEnds, limits: (usize, usize, usize)) -> *mut ibv_qp {
    let qp_type = soft.qp_type();
    let qp_base = ibv_qp {
        context: ends.context,
        qp_context: a.qp_context,
        pd: ends.pd,
        send_cq: ends.send_cq,
        recv_cq: ends.recv_cq,
        srq: ends.srq,
        handle: soft.qp_num(),
        qp_num: soft.qp_num(),
        state: 0,
        qp_type: a.qp_type,
        // SAFETY: all-zero pthread objects are their static initializers on Linux.
        mutex: unsafe { std::mem::zeroed() },
        // SAFETY: as above.
        cond: unsafe { std::mem::zeroed() },
        events_completed: 0,
    };
    let qpn = soft.qp_num();
    let (max_send_sge, max_recv_sge, max_inline) = limits;
    let q = Box::into_raw(Box::new(Qp {
        ibv: crate::wr::qp_ex(qp_base, qp_type),
        qp: soft,
        sq_sig_all: a.sq_sig_all != 0,
        max_send_sge,
        max_recv_sge,
        max_inline,
        access_flags: Default::default(),
        ece: Default::default(),
        extended: a.send_ops.is_some(),
        batch: Default::default(),
        builder: Default::default(),
        xrcd: ends.xrcd,
    }));
    // SAFETY: as the caller promises.
    let cx = unsafe { ctx(ends.context) };
    cx.objects.lock().unwrap_or_else(|e| e.into_inner()).qps.insert(qpn, q as usize);
    q.cast()
}

/// Creates an XRC target QP in domain `x` (`ibv_create_qp_ex` with IBV_QP_INIT_ATTR_XRCD): no
/// PD, CQs, SRQ or queues (its caps come back 0), as the kernel's `create_xrc_qp_user` makes
/// it; the `ibv_qp` names the PD (`pd`, null unless given) and CQs the program gave, as
/// libibverbs' `set_qp` fills it.
///
/// # Safety
/// `x` is a live XRC domain handle of this library.
unsafe fn create_tgt(x: *mut ibv_xrcd, pd: *mut ibv_pd, a: CreateQp<'_>) -> *mut ibv_qp {
    // SAFETY: as the caller promises.
    let h = unsafe { crate::xrcd::xrcd(x) };
    if a.qp_type != IBV_QPT_XRC_RECV || a.send_ops.is_some_and(|ops| ops != 0) {
        return fail(libc::EINVAL);
    }
    let soft = match h.domain.xrcd.create_tgt_qp() {
        Ok(q) => q,
        Err(e) => return fail(errno_of(&e)),
    };
    h.hold();
    *a.cap = ibv_qp_cap { max_send_wr: 0, max_recv_wr: 0, max_send_sge: 0, max_recv_sge: 0, max_inline_data: 0 };
    let ends = QpEnds { context: h.context(), pd, send_cq: a.send_cq, recv_cq: a.recv_cq, srq: a.srq, xrcd: x };
    // SAFETY: the domain's context is open while the domain is.
    unsafe { new_qp(soft, &a, ends, (0, 0, 0)) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(p: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    // SAFETY: a writable init attribute structure (its `cap` is updated).
    let a = unsafe { &mut *attr };
    let c = CreateQp {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: &mut a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
        send_ops: None,
    };
    // SAFETY: a live PD and objects of its context, as the caller promises.
    unsafe { create(p, c) }
}

/// `verbs_context.create_qp_ex`: a PD is required, or for an XRC target its XRC domain (of
/// this context: EINVAL otherwise, as the kernel finds no such handle in the caller's file);
/// of the other attributes only the send operations are known here, and creation flags
/// (other than none), TSO, RSS and a source QPN (which need Raw Packet QPs or hardware
/// offloads) are EOPNOTSUPP.
pub(crate) unsafe extern "C" fn create_qp_ex(context: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a writable init attribute structure (its `cap` is updated).
    let a = unsafe { &mut *attr };
    let known = IBV_QP_INIT_ATTR_PD
        | IBV_QP_INIT_ATTR_XRCD
        | IBV_QP_INIT_ATTR_CREATE_FLAGS
        | IBV_QP_INIT_ATTR_MAX_TSO_HEADER
        | IBV_QP_INIT_ATTR_IND_TABLE
        | IBV_QP_INIT_ATTR_RX_HASH
        | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if a.comp_mask & !known != 0 {
        return fail(libc::EINVAL);
    }
    // libibverbs' `ibv_cmd_create_qp_ex2`: an XRC target needs its domain, every other type a
    // PD.
    let tgt = a.qp_type == IBV_QPT_XRC_RECV;
    let (needed, object) = if tgt {
        (IBV_QP_INIT_ATTR_XRCD, a.xrcd.cast::<c_void>())
    } else {
        (IBV_QP_INIT_ATTR_PD, a.pd.cast::<c_void>())
    };
    if a.comp_mask & needed == 0 || object.is_null() {
        return fail(libc::EINVAL);
    }
    // Creation flags are accepted when none is set (programs pass the mask with 0); any flag
    // is EOPNOTSUPP, as rxe answers.
    let flags_given = a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0;
    let supported =
        IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    if a.comp_mask & !supported != 0 || flags_given {
        return fail(libc::EOPNOTSUPP);
    }
    let send_ops = (a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(a.send_ops_flags);
    let c = CreateQp {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: &mut a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
        send_ops,
    };
    if tgt {
        // SAFETY: a live XRC domain, as the caller promises.
        if unsafe { crate::xrcd::xrcd(a.xrcd.cast()) }.context() != context {
            return fail(libc::EINVAL);
        }
        let pd = if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 { a.pd } else { null_mut() };
        // SAFETY: a live XRC domain, as the caller promises.
        return unsafe { create_tgt(a.xrcd.cast(), pd, c) };
    }
    // SAFETY: a live PD and objects of its context, as the caller promises.
    unsafe { create(a.pd, c) }
}

/// The QP's `ibv_qp_ex` if it was created with send operations, else NULL (libibverbs).
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(q: *mut ibv_qp) -> *mut ibv_qp_ex {
    // SAFETY: a live QP of this library.
    if q.is_null() || !unsafe { qp(q) }.extended {
        return std::ptr::null_mut();
    }
    q.cast()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(q: *mut ibv_qp) -> c_int {
    command(|| {
        // SAFETY: the caller's live QP.
        unsafe { destroy_qp(q, true) }
    })
}

/// What runs with a QP that Destroy QP has destroyed and is about to free: the connection
/// manager registers it (`rdma_create_qp`) to take the QP from the id that holds it, for a
/// program that destroys such a QP with `ibv_destroy_qp` (rping does) while the CM thread may
/// still move it on a DREQ or a REJ. A hook rather than a call: the verbs do not depend on the
/// connection manager built on them.
static ON_DESTROY: OnceLock<fn(*mut ibv_qp)> = OnceLock::new();

/// Registers [`ON_DESTROY`]'s hook (the first registration stays).
pub(crate) fn on_destroy(hook: fn(*mut ibv_qp)) {
    let _ = ON_DESTROY.set(hook);
}

/// Destroy QP; `forget` runs [`ON_DESTROY`]'s hook. `rdma_destroy_qp`, which holds the CM's
/// lock and clears the id itself, passes false.
///
/// # Safety
/// `q` is a live QP of this library.
pub(crate) unsafe fn destroy_qp(q: *mut ibv_qp, forget: bool) -> c_int {
    // SAFETY: a live QP.
    let x = unsafe { qp(q) };
    // SAFETY: the QP's context is open.
    if unsafe { crate::context::left_by_fork(x.ibv.qp_base.context) } {
        return 0;
    }
    // uverbs refuses to destroy a QP still attached to a multicast group; closing the context
    // detaches it (the core's Destroy QP, which `ibv_close_device` uses, does).
    if !x.qp.mcast_groups().is_empty() {
        return libc::EBUSY;
    }
    // What the program posted leaves first, as it would have in its ibv_post_send on Linux
    // (`SETTLE_MAX` says why a QP whose peer is gone is not held up by it).
    crate::settle(|| x.qp.unsent(), crate::SETTLE_MAX);
    if let Err(e) = x.qp.destroy() {
        return errno_of(&e);
    }
    if let Some(hook) = ON_DESTROY.get().filter(|_| forget) {
        hook(q);
    }
    if x.xrcd.is_null() {
        // SAFETY: the PD the QP was made through, live while the QP held it. (An XRC target's
        // `pd` is only what the program passed: it was made through its domain.)
        unsafe { crate::domain::release(x.ibv.qp_base.pd) };
    }
    if !x.xrcd.is_null() {
        // SAFETY: the domain handle stays open while the QP holds it.
        unsafe { crate::xrcd::xrcd(x.xrcd) }.release();
    }
    // SAFETY: the QP's context is open.
    let cx = unsafe { ctx(x.ibv.qp_base.context) };
    cx.forget(softhca::EventElement::Qp(x.ibv.qp_base.qp_num));
    // SAFETY: the QP's own fields.
    unsafe {
        wait_for_acks(
            cx,
            q as usize,
            std::ptr::addr_of_mut!((*q).mutex),
            std::ptr::addr_of_mut!((*q).cond),
            std::ptr::addr_of!((*q).events_completed),
        )
    };
    // SAFETY: from ibv_create_qp's Box::into_raw, freed once.
    drop(unsafe { Box::from_raw(q as *mut Qp) });
    0
}

fn mtu_of(code: c_int) -> Option<Mtu> {
    Mtu::from_code(u32::try_from(code).ok()?).ok()
}

/// Modify QP with libibverbs' attribute mask. The mask is checked as Linux checks it
/// ([`crate::modify_mask`]); `IBV_QP_CUR_STATE` must name the current state, and on a UC QP
/// the Read and Atomic enables, which Linux ignores there, are accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(q: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    command(|| {
        // A bit past IBV_QP_DEST_QPN is refused before anything else: libibverbs' legacy Modify QP
        // command refuses IBV_QP_RATE_LIMIT and above, the kernel's the bits between, both with
        // EOPNOTSUPP.
        if mask & !((IBV_QP_DEST_QPN << 1) - 1) != 0 {
            return libc::EOPNOTSUPP;
        }
        // SAFETY: a live QP and readable attributes.
        let (x, a) = unsafe { (qp(q), &*attr) };
        let mask = crate::modify_mask::applicable(x.qp.qp_type(), mask);
        let has = |bit: c_int| mask & bit != 0;
        let current = match x.qp.state() {
            Ok(s) => s,
            Err(e) => return errno_of(&e),
        };
        if has(IBV_QP_CUR_STATE) && qp_state_of(a.cur_qp_state) != Some(current) {
            return libc::EINVAL;
        }
        let target = if has(IBV_QP_STATE) {
            match qp_state_of(a.qp_state) {
                Some(s) => s,
                None => return libc::EINVAL,
            }
        } else {
            current
        };
        if let Err(e) = crate::modify_mask::check(x.qp.qp_type(), current, target, mask) {
            return e;
        }
        let mut m = QpAttr::new(target);
        if has(IBV_QP_ACCESS_FLAGS) {
            let mut access = Access::from_bits_truncate(a.qp_access_flags) & Access::REMOTE;
            if x.qp.qp_type() == QpType::Uc {
                access &= Access::REMOTE_WRITE;
            }
            m.access = Some(access);
        }
        if has(IBV_QP_PKEY_INDEX) {
            m.pkey_index = Some(a.pkey_index);
        }
        if has(IBV_QP_PORT) {
            m.port_num = Some(a.port_num);
        }
        if has(IBV_QP_QKEY) {
            m.qkey = Some(a.qkey);
        }
        if has(IBV_QP_AV) || has(IBV_QP_PATH_MTU) {
            let old = x.qp.query().ok().and_then(|q| q.av);
            let mtu = if has(IBV_QP_PATH_MTU) {
                match mtu_of(a.path_mtu) {
                    Some(m) => m,
                    None => return libc::EINVAL,
                }
            } else {
                old.map_or(Mtu::Mtu1024, |av| av.path_mtu)
            };
            let ah = if has(IBV_QP_AV) {
                // SAFETY: the QP's context is open.
                match resolve_ah_attr(&unsafe { ctx(x.ibv.qp_base.context) }.ctx, &a.ah_attr) {
                    Ok(ah) => Some(ah),
                    Err(e) => return e,
                }
            } else {
                old.map(|av| av.ah)
            };
            if let Some(ah) = ah {
                m.av = Some(AddressVector::new(ah, mtu));
            }
        }
        if has(IBV_QP_TIMEOUT) {
            m.timeout = Some(a.timeout);
        }
        if has(IBV_QP_RETRY_CNT) {
            m.retry_cnt = Some(a.retry_cnt);
        }
        if has(IBV_QP_RNR_RETRY) {
            m.rnr_retry = Some(a.rnr_retry);
        }
        // Linux's core masks a PSN to its 24 bits (`_ib_modify_qp`, with a warning), so a
        // program that draws it with an unmasked `lrand48()` connects there.
        if has(IBV_QP_RQ_PSN) {
            m.rq_psn = Some(a.rq_psn & PSN_MASK);
        }
        if has(IBV_QP_SQ_PSN) {
            m.sq_psn = Some(a.sq_psn & PSN_MASK);
        }
        // Both depths to the next power of two, as rxe (roundup_pow_of_two) and mlx5 (which
        // keeps their logarithms) do: Query QP reports 4 for 3 on either. A value past the
        // device's maximum stays as given, for the core to refuse.
        let pow2 = |v: u8| if v == 0 { 0 } else { v.checked_next_power_of_two().unwrap_or(v) };
        if has(IBV_QP_MAX_QP_RD_ATOMIC) {
            m.max_rd_atomic = Some(pow2(a.max_rd_atomic));
        }
        if has(IBV_QP_MAX_DEST_RD_ATOMIC) {
            m.max_dest_rd_atomic = Some(pow2(a.max_dest_rd_atomic));
        }
        if has(IBV_QP_MIN_RNR_TIMER) {
            m.min_rnr_timer = Some(a.min_rnr_timer);
        }
        if has(IBV_QP_DEST_QPN) {
            m.dest_qp_num = Some(a.dest_qp_num);
        }
        if has(IBV_QP_EN_SQD_ASYNC_NOTIFY) {
            m.en_sqd_async_notify = Some(a.en_sqd_async_notify != 0);
        }
        if has(IBV_QP_PATH_MIG_STATE) {
            m.path_mig_state = Some(match a.path_mig_state {
                0 => MigState::Migrated,
                1 => MigState::Rearm,
                _ => MigState::Armed,
            });
        }
        if has(IBV_QP_CAP) {
            m.cap = Some(WqSizes { max_send_wr: a.cap.max_send_wr, max_recv_wr: a.cap.max_recv_wr });
        }
        if has(IBV_QP_ALT_PATH) {
            // SAFETY: the QP's context is open.
            let dev = &unsafe { ctx(x.ibv.qp_base.context) }.ctx;
            // The kernel looks the source GID up first (ENODATA for an empty slot); without a
            // second address there is no Automatic Path Migration (MOD-GEN-9): EINVAL, as the
            // kernel answers for a RoCE device without it.
            if crate::mem::empty_source(dev, &a.alt_ah_attr) {
                return libc::ENODATA;
            }
            if !dev.query_device().is_ok_and(|d| d.auto_path_mig) {
                return libc::EINVAL;
            }
            // One path MTU serves both paths (ibv_qp_attr has one).
            let mtu = m.av.map(|av| av.path_mtu).or_else(|| x.qp.query().ok()?.av.map(|av| av.path_mtu));
            m.alt_path = Some(AltPath {
                av: AddressVector::new(ah_attr_of(&a.alt_ah_attr), mtu.unwrap_or(Mtu::Mtu1024)),
                pkey_index: a.alt_pkey_index,
                port_num: a.alt_port_num,
                timeout: a.alt_timeout,
            });
        }
        match x.qp.modify(&m) {
            Ok(()) => {
                // Reset clears the attributes (the core's too: README, "Where softhca differs").
                let flags = if target == QpState::Reset {
                    Some(0)
                } else {
                    has(IBV_QP_ACCESS_FLAGS).then_some(a.qp_access_flags)
                };
                if let Some(f) = flags {
                    x.access_flags.store(f as i32, std::sync::atomic::Ordering::Relaxed);
                }
                // SAFETY: the program's copy of the state, written in place (as libibverbs does
                // after a successful Modify QP) without a reference to the shared object.
                unsafe { set_state(q, x.qp.state().unwrap_or(target)) };
                0
            }
            Err(e) => errno_of(&e),
        }
    })
}

/// Writes `qp->state` under the QP's mutex.
///
/// # Safety
/// `q` is a live QP.
unsafe fn set_state(q: *mut ibv_qp, s: QpState) {
    // SAFETY: fields of a live QP, written through raw pointers under its mutex.
    unsafe {
        let m = std::ptr::addr_of_mut!((*q).mutex);
        libc::pthread_mutex_lock(m);
        std::ptr::addr_of_mut!((*q).state).write(qp_state_code(s));
        libc::pthread_mutex_unlock(m);
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    q: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    command(|| {
        // libibverbs' Query QP command: an attribute from IBV_QP_RATE_LIMIT on goes through
        // the extended path only.
        if mask & !(IBV_QP_RATE_LIMIT - 1) != 0 {
            return libc::EOPNOTSUPP;
        }
        // SAFETY: a live QP; writable output structures.
        let x = unsafe { qp(q) };
        let s = match x.qp.query() {
            Ok(s) => s,
            Err(e) => return errno_of(&e),
        };
        // SAFETY: a live QP (libibverbs refreshes `qp->state` on every query).
        unsafe { set_state(q, s.qp_state) };
        let ah = s.av.map(|av| c_ah_attr(&av.ah));
        // SAFETY: ibv_qp_attr is plain old data; all-zero is valid.
        let mut out: ibv_qp_attr = unsafe { std::mem::zeroed() };
        out.qp_state = qp_state_code(s.qp_state);
        out.cur_qp_state = out.qp_state;
        // Before a path is set, 256 (rxe's initial path MTU).
        out.path_mtu = s.av.map_or(1, |av| av.path_mtu as c_int);
        out.path_mig_state = match s.path_mig_state {
            MigState::Migrated => 0,
            MigState::Rearm => 1,
            MigState::Armed => 2,
        };
        out.qkey = s.qkey;
        out.rq_psn = s.rq_psn;
        out.sq_psn = s.sq_psn;
        out.dest_qp_num = s.dest_qp_num;
        out.qp_access_flags = x.access_flags.load(std::sync::atomic::Ordering::Relaxed) as _;
        out.cap = c_cap(&s.cap);
        // A RoCE port's address vector always has a GRH: before one is set, the zeroed one
        // still says so (rxe reports is_global 1 in Reset too).
        out.ah_attr.is_global = 1;
        out.alt_ah_attr.is_global = 1;
        if let Some(ah) = ah {
            out.ah_attr = ah;
        }
        if let Some(alt) = s.alt {
            out.alt_ah_attr = c_ah_attr(&alt.av.ah);
            out.alt_pkey_index = alt.pkey_index;
            out.alt_port_num = alt.port_num;
            out.alt_timeout = alt.timeout;
        }
        out.pkey_index = s.pkey_index;
        out.en_sqd_async_notify = s.en_sqd_async_notify as u8;
        out.sq_draining = s.sq_draining as u8;
        out.max_rd_atomic = s.max_rd_atomic;
        out.max_dest_rd_atomic = s.max_dest_rd_atomic;
        out.min_rnr_timer = s.min_rnr_timer;
        out.port_num = s.port_num;
        out.timeout = s.timeout;
        out.retry_cnt = s.retry_cnt;
        out.rnr_retry = s.rnr_retry;
        // SAFETY: writable outputs, as the caller promises.
        unsafe {
            std::ptr::write(attr, out);
            if !init_attr.is_null() {
                std::ptr::write(
                    init_attr,
                    ibv_qp_init_attr {
                        qp_context: x.ibv.qp_base.qp_context,
                        send_cq: x.ibv.qp_base.send_cq,
                        recv_cq: x.ibv.qp_base.recv_cq,
                        srq: x.ibv.qp_base.srq,
                        cap: c_cap(&s.cap),
                        qp_type: x.ibv.qp_base.qp_type,
                        sq_sig_all: x.sq_sig_all as c_int,
                    },
                );
            }
        }
        0
    })
}

/// A PSN's 24 bits.
const PSN_MASK: u32 = 0xFF_FFFF;

/// The most SGEs one work request may carry here (softhca's max_sge).
pub(crate) const MAX_SGE: usize = 32;
/// The most work requests one post takes from a list: softhca's max_qp_wr, more than any
/// queue holds, where rxe's provider answers ENOMEM at the first that does not fit. Posting
/// in Error flushes each at once, so no queue fills there: without this a circular list
/// (`wr.next = &wr`) would be posted for ever.
const MAX_POST_LIST: usize = 1 << 14;
/// The most inline bytes (softhca's max_inline_data).
pub(crate) const MAX_INLINE: usize = 512;

/// Room for a C gather list, left uninitialized: every post has one on its stack, and
/// zeroing its 512 bytes first was a memset a post (under emulation, vector stores emulated
/// one by one).
type SgeRoom = [MaybeUninit<Sge>; MAX_SGE];

/// Copies a C gather list into `out`; None if it is negative or longer than `max` (the
/// queue's limit) or [`MAX_SGE`], before any entry is read.
///
/// # Safety
/// `list` points at `n` readable SGEs (or `n` is 0).
unsafe fn sges(list: *const ibv_sge, n: c_int, max: usize, out: &mut SgeRoom) -> Option<&[Sge]> {
    let n = usize::try_from(n).ok().filter(|&n| n <= max.min(MAX_SGE))?;
    for (k, o) in out[..n].iter_mut().enumerate() {
        // SAFETY: k < n, within the caller's list.
        let s = unsafe { *list.add(k) };
        o.write(Sge { addr: s.addr, length: s.length, lkey: s.lkey });
    }
    // SAFETY: the first n elements were written just above, and MaybeUninit<Sge> has Sge's
    // layout.
    Some(unsafe { std::slice::from_raw_parts(out.as_ptr().cast::<Sge>(), n) })
}

fn wr_opcode_of(code: c_int) -> Option<WrOpcode> {
    Some(match code {
        IBV_WR_RDMA_WRITE => WrOpcode::RdmaWrite,
        IBV_WR_RDMA_WRITE_WITH_IMM => WrOpcode::RdmaWriteWithImm,
        IBV_WR_SEND => WrOpcode::Send,
        IBV_WR_SEND_WITH_IMM => WrOpcode::SendWithImm,
        IBV_WR_RDMA_READ => WrOpcode::RdmaRead,
        IBV_WR_ATOMIC_CMP_AND_SWP => WrOpcode::AtomicCmpSwp,
        IBV_WR_ATOMIC_FETCH_AND_ADD => WrOpcode::AtomicFetchAdd,
        IBV_WR_LOCAL_INV => WrOpcode::LocalInv,
        IBV_WR_SEND_WITH_INV => WrOpcode::SendWithInv,
        IBV_WR_ATOMIC_WRITE => WrOpcode::AtomicWrite,
        _ => return None,
    })
}

/// Posts one C send work request.
///
/// # Safety
/// `w` is a readable work request whose gather list and (UD) address handle are live; with
/// IBV_SEND_INLINE its gather list names readable memory.
unsafe fn post_one_send(x: &Qp, w: &ibv_send_wr) -> c_int {
    let mut list: SgeRoom = [MaybeUninit::uninit(); MAX_SGE];
    // An inline WR's list is copied now and never gathered: max_send_sge does not bound it
    // (rxe reports a max_sge large enough for max_inline_data in 16-byte pieces).
    let max = if w.send_flags & IBV_SEND_INLINE != 0 { MAX_SGE } else { x.max_send_sge };
    // SAFETY: the caller's gather list.
    let Some(sg) = (unsafe { sges(w.sg_list, w.num_sge, max, &mut list) }) else { return libc::EINVAL };
    if w.opcode == IBV_WR_BIND_MW {
        // SAFETY: the union member a Bind MW work request carries.
        return unsafe { post_bind(x, w) };
    }
    let Some(opcode) = wr_opcode_of(w.opcode) else { return libc::EINVAL };
    let flags = SendFlags::from_bits_truncate(w.send_flags);
    // Uninitialized, as the gather list's room: only what the copies below write is read.
    let mut inline = MaybeUninit::<[u8; MAX_INLINE]>::uninit();
    let mut wr = SendWr { wr_id: w.wr_id, opcode, send_flags: flags, sg_list: sg, ..SendWr::default() };
    if flags.contains(SendFlags::INLINE) {
        let base = inline.as_mut_ptr().cast::<u8>();
        let mut at = 0;
        for s in sg {
            let len = s.length as usize;
            if at + len > MAX_INLINE {
                return libc::EINVAL;
            }
            // SAFETY: with IBV_SEND_INLINE the program's gather list names readable memory
            // of these lengths (the data is copied now, the keys are not checked); `at + len`
            // is within the buffer.
            unsafe { std::ptr::copy_nonoverlapping(s.addr as *const u8, base.add(at), len) };
            at += len;
        }
        // SAFETY: the copies above wrote bytes 0..at.
        wr.inline_data = unsafe { std::slice::from_raw_parts(base, at) };
    }
    match opcode {
        WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm => wr.imm_data = u32::from_be(w.imm_data),
        WrOpcode::SendWithInv | WrOpcode::LocalInv => wr.invalidate_rkey = w.imm_data,
        _ => {}
    }
    // SAFETY: the union member the opcode (and the QP type) selects, as libibverbs reads it.
    unsafe {
        match opcode {
            // An Atomic Write's 8 bytes are its gather list's (or inline), its word `wr.rdma`'s.
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead | WrOpcode::AtomicWrite => {
                wr.remote_addr = w.wr.rdma.remote_addr;
                wr.rkey = w.wr.rdma.rkey;
            }
            WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd => {
                wr.remote_addr = w.wr.atomic.remote_addr;
                wr.rkey = w.wr.atomic.rkey;
                wr.compare_add = w.wr.atomic.compare_add;
                wr.swap = w.wr.atomic.swap;
            }
            _ => {}
        }
    }
    let ah;
    if x.qp.qp_type() == QpType::Ud {
        // SAFETY: a UD work request carries an address handle, remote QPN and Q_Key.
        let ud = unsafe { w.wr.ud };
        if ud.ah.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live AH from ibv_create_ah.
        ah = unsafe { &*(ud.ah as *const Ah) };
        wr.ah = Some(&ah.ah);
        wr.remote_qpn = ud.remote_qpn;
        wr.remote_qkey = ud.remote_qkey;
    }
    if x.qp.qp_type() == QpType::XrcSend {
        wr.xrc_srqn = w.qp_type; // qp_type.xrc.remote_srqn
    }
    match x.qp.post_send(&[wr]) {
        Ok(()) => 0,
        Err(PostError { error, .. }) => errno_of(&error),
    }
}

/// `ops.post_send`: each WR is posted in turn; the first that fails is `*bad_wr` and the ones
/// before it stay posted, as libibverbs does (the Rust API posts a list all or nothing).
pub(crate) unsafe extern "C" fn post_send(
    q: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: a live QP.
    let x = unsafe { qp(q) };
    let mut w = wr;
    let mut taken = 0;
    while !w.is_null() {
        taken += 1;
        // SAFETY: a readable list of work requests, as the caller promises.
        let r = if taken > MAX_POST_LIST { libc::ENOMEM } else { unsafe { post_one_send(x, &*w) } };
        if r != 0 {
            if !bad_wr.is_null() {
                // SAFETY: a writable out-pointer.
                unsafe { *bad_wr = w };
            }
            return r;
        }
        // SAFETY: as above.
        w = unsafe { (*w).next };
    }
    0
}

/// An `IBV_WR_BIND_MW` work request (a type 2 window's bind, or a type 1 one's).
///
/// # Safety
/// `w` is a Bind MW work request naming a live window and a live region of this library.
unsafe fn post_bind(x: &Qp, w: &ibv_send_wr) -> c_int {
    let b = w.bind_mw;
    if b.mw.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's contract.
    unsafe { bind_window(x, b.mw, b.rkey, &b.bind_info, w.wr_id, w.send_flags) }
}

/// `ops.bind_mw` (`ibv_bind_mw`, type 1 only, as libibverbs has it): the new R_Key is the
/// window's current one with its low byte incremented (`ibv_inc_rkey`), written to
/// `mw->rkey` once posted, as rxe's and mlx5's providers do.
pub(crate) unsafe extern "C" fn bind_mw(q: *mut ibv_qp, m: *mut ibv_mw, b: *mut ibv_mw_bind) -> c_int {
    command(|| {
        // SAFETY: a live QP, a live window and a readable bind description, as verbs.h's inline
        // ibv_bind_mw passes them.
        let (x, w, b) = unsafe { (qp(q), &*(m as *const Mw), &*b) };
        let r = if w.ibv.mw_type != 1 {
            libc::EINVAL // type 2 windows are bound by IBV_WR_BIND_MW work requests
        } else {
            // SAFETY: the program's copy of the R_Key, read in place.
            let next = ibv_inc_rkey(unsafe { std::ptr::addr_of!((*m).rkey).read() });
            // SAFETY: as this function's callers promise.
            let r = unsafe { bind_window(x, m, next, &b.bind_info, b.wr_id, b.send_flags) };
            if r == 0 {
                // SAFETY: as above, written in place.
                unsafe { std::ptr::addr_of_mut!((*m).rkey).write(next) };
            }
            r
        };
        if r != 0 {
            crate::set_errno(r);
        }
        r
    })
}

/// `ibv_inc_rkey`: the next key byte, the index unchanged.
fn ibv_inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | u32::from((rkey as u8).wrapping_add(1))
}

/// Posts a Bind MW of window `m` over `info` that gives it R_Key `rkey` (the window's index,
/// the program's key byte). `m->rkey` is left as it is: a type 2 window's key is the
/// program's to keep (rxe's and mlx5's providers leave it too; only `ibv_bind_mw` writes it).
///
/// # Safety
/// `m` and `info.mr` (unless null) are live objects of this library.
unsafe fn bind_window(x: &Qp, m: *mut ibv_mw, rkey: u32, info: &ibv_mw_bind_info, wr_id: u64, flags: u32) -> c_int {
    if info.mw_access_flags & IBV_ACCESS_ZERO_BASED != 0 || (info.mr.is_null() && info.length != 0) {
        return libc::EINVAL; // windows are addressed by virtual address only; a bind needs a region
    }
    // SAFETY: a live window and, if not null, region, as the caller promises.
    let (mw, mr) = unsafe { (&*(m as *const Mw), (info.mr as *const Mr).as_ref()) };
    // SAFETY: the program's copy of the R_Key, read in place.
    let current = unsafe { std::ptr::addr_of!((*m).rkey).read() };
    if rkey >> 8 != current >> 8 {
        return libc::EINVAL; // another window's index
    }
    let access = Access::from_bits_truncate(info.mw_access_flags) & Access::REMOTE;
    // A zero-length bind unbinds a type 1 window (libibverbs' way: no region, length 0).
    let wr = match mr {
        Some(mr) if info.length != 0 => SendWr::bind_mw(wr_id, &mw.mw, &mr.region(), info.addr, info.length, access),
        _ => SendWr::unbind_mw(wr_id, &mw.mw),
    };
    let mut wr = wr.new_key(rkey as u8);
    wr.send_flags = SendFlags::from_bits_truncate(flags);
    x.qp.post_send(&[wr]).map_or_else(|PostError { error, .. }| errno_of(&error), |()| 0)
}

/// Posts a C receive list through `post` (a QP's RQ or an SRQ), one WR at a time.
///
/// # Safety
/// `wr` is a readable list of receive work requests with readable gather lists.
unsafe fn post_recv_list(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    max_sge: usize,
    post: impl Fn(&[RecvWr<'_>]) -> Result<(), PostError>,
) -> c_int {
    let mut w = wr;
    let mut taken = 0;
    while !w.is_null() {
        taken += 1;
        // SAFETY: a readable work request.
        let r = unsafe { &*w };
        let mut list: SgeRoom = [MaybeUninit::uninit(); MAX_SGE];
        let res = if taken > MAX_POST_LIST {
            Err(libc::ENOMEM)
        } else {
            // SAFETY: its gather list.
            match unsafe { sges(r.sg_list, r.num_sge, max_sge, &mut list) } {
                Some(sg) => post(&[RecvWr::new(r.wr_id, sg)]).map_err(|e| errno_of(&e.error)),
                None => Err(libc::EINVAL),
            }
        };
        if let Err(e) = res {
            if !bad_wr.is_null() {
                // SAFETY: a writable out-pointer.
                unsafe { *bad_wr = w };
            }
            return e;
        }
        w = r.next;
    }
    0
}

pub(crate) unsafe extern "C" fn post_recv(
    q: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: a live QP.
    let x = unsafe { qp(q) };
    // SAFETY: a readable list of receive work requests, as the caller promises.
    unsafe { post_recv_list(wr, bad_wr, x.max_recv_sge, |w| x.qp.post_recv(w)) }
}

pub(crate) unsafe extern "C" fn post_srq_recv(
    s: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: a live SRQ from ibv_create_srq (its C structure is the box's first field).
    let x = unsafe { &*(s as *const Srq) };
    // SAFETY: a readable list of receive work requests, as the caller promises.
    unsafe { post_recv_list(wr, bad_wr, x.max_sge, |w| x.srq.post_recv(w)) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(p: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    // SAFETY: a live PD and a writable init attribute structure (its sizes are updated).
    let (pd, a) = unsafe { (pd(p), &mut *attr) };
    // The limit is "irrelevant for ibv_create_srq" (verbs.h): an SRQ starts unarmed.
    let init = SrqInitAttr { max_wr: a.attr.max_wr, max_sge: a.attr.max_sge, srq_limit: 0 };
    let soft = match pd.pd.create_srq(&init) {
        Ok(s) => s,
        Err(e) => return fail(errno_of(&e)),
    };
    // SAFETY: the PD's context is open.
    unsafe { new_srq(soft, p, a, null_mut()) }
}

/// The program's `ibv_srq` for `soft`, made on PD `p` (of an open context) with `a` (whose
/// sizes are written back) and, for an XRC SRQ, domain handle `xrcd` (held until it goes);
/// registered with its context.
///
/// # Safety
/// `p` is a live PD of this library, its context open.
unsafe fn new_srq(soft: SoftSrq, p: *mut ibv_pd, a: &mut ibv_srq_init_attr, xrcd: *mut ibv_xrcd) -> *mut ibv_srq {
    // SAFETY: as the caller promises.
    let context = unsafe { pd(p) }.ibv.context;
    let mut max_sge = MAX_SGE;
    if let Ok(q) = soft.query() {
        a.attr = ibv_srq_attr { max_wr: q.max_wr, max_sge: q.max_sge, srq_limit: q.srq_limit };
        max_sge = q.max_sge as usize;
    }
    let ibv = ibv_srq {
        context,
        srq_context: a.srq_context,
        pd: p,
        handle: soft.handle(),
        // SAFETY: all-zero pthread objects are their static initializers on Linux.
        mutex: unsafe { std::mem::zeroed() },
        // SAFETY: as above.
        cond: unsafe { std::mem::zeroed() },
        events_completed: 0,
    };
    let handle = soft.handle();
    let s = Box::into_raw(Box::new(Srq { ibv, srq: soft, max_sge, xrcd }));
    // SAFETY: the PD's context is open.
    let cx = unsafe { ctx(context) };
    cx.objects.lock().unwrap_or_else(|e| e.into_inner()).srqs.insert(handle, s as usize);
    s.cast()
}

/// `ibv_create_srq_ex`, which verbs.h calls when the attributes name more than a PD and the
/// basic type (a CQ, say). The checks are libibverbs' `ibv_cmd_create_srq_ex`'s, in its
/// order: an unknown `comp_mask` bit EOPNOTSUPP, no PD EINVAL, an XRC SRQ without its XRC
/// domain and CQ or a tag-matching one without its CQ and tags EINVAL. A basic SRQ is made as
/// `ibv_create_srq` makes one (the kernel ignores a basic SRQ's CQ); an XRC SRQ in its domain,
/// its receives completing on its CQ; tag matching is not built here (EOPNOTSUPP; Linux rxe
/// has none).
pub(crate) unsafe extern "C" fn create_srq_ex(_c: *mut ibv_context, attr: *mut ibv_srq_init_attr_ex) -> *mut ibv_srq {
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the program's attributes (verbs.h's contract).
    let a = unsafe { &*attr };
    let has = |bits: u32| a.comp_mask & bits == bits;
    if a.comp_mask >= IBV_SRQ_INIT_ATTR_RESERVED {
        return fail(libc::EOPNOTSUPP);
    }
    if !has(IBV_SRQ_INIT_ATTR_PD) || a.pd.is_null() {
        return fail(libc::EINVAL);
    }
    let srq_type = if has(IBV_SRQ_INIT_ATTR_TYPE) { a.srq_type } else { IBV_SRQT_BASIC };
    let complete = match srq_type {
        IBV_SRQT_BASIC => true,
        IBV_SRQT_XRC => has(IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ),
        IBV_SRQT_TM => has(IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM) && a.tm_cap[0] != 0,
        _ => false,
    };
    if !complete {
        return fail(libc::EINVAL);
    }
    if srq_type == IBV_SRQT_XRC {
        // SAFETY: the program's live PD, domain and CQ (verbs.h's contract).
        return unsafe { create_xrc_srq(attr) };
    }
    if srq_type != IBV_SRQT_BASIC {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: a PD of the program's (checked non-null above); the extended structure starts
    // with the basic one, whose sizes ibv_create_srq writes back.
    unsafe { ibv_create_srq(a.pd, attr.cast::<ibv_srq_init_attr>()) }
}

/// An XRC SRQ for [`create_srq_ex`]: its domain, CQ and PD must be of one context (the
/// kernel finds each handle in the caller's file, EINVAL otherwise).
///
/// # Safety
/// `attr` is writable, its PD, domain and CQ live objects of this library.
unsafe fn create_xrc_srq(attr: *mut ibv_srq_init_attr_ex) -> *mut ibv_srq {
    // SAFETY: as the caller promises (the copies end the borrow before `attr` is written).
    let (p, x, cqp, max_wr, max_sge) = unsafe {
        let a = &*attr;
        (a.pd, a.xrcd.cast::<ibv_xrcd>(), a.cq, a.attr.max_wr, a.attr.max_sge)
    };
    if x.is_null() || cqp.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: as the caller promises.
    let (pd, h, c) = unsafe { (pd(p), crate::xrcd::xrcd(x), cq(cqp)) };
    let here = pd.ibv.context;
    if h.context() != here || c.ibv.base.context != here {
        return fail(libc::EINVAL);
    }
    let init = SrqInitAttr { max_wr, max_sge, srq_limit: 0 };
    let soft = match pd.pd.create_xrc_srq(&h.domain.xrcd, &c.cq, &init) {
        Ok(s) => s,
        Err(e) => return fail(errno_of(&e)),
    };
    h.hold();
    // SAFETY: the PD's context is open; the extended attributes start with the basic ones,
    // whose sizes are written back.
    unsafe { new_srq(soft, p, &mut *attr.cast::<ibv_srq_init_attr>(), x) }
}

/// `verbs_context.get_srq_num`: the SRQ's number, which an XRC initiator's work requests name.
pub(crate) unsafe extern "C" fn get_srq_num(s: *mut ibv_srq, srq_num: *mut u32) -> c_int {
    if s.is_null() || srq_num.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live SRQ of this library and a writable out-pointer.
    unsafe { *srq_num = (*(s as *const Srq)).srq.srq_num() };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(s: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    command(|| {
        // SAFETY: a live SRQ and readable attributes.
        let (x, a) = unsafe { (&*(s as *const Srq), &*attr) };
        const IBV_SRQ_MAX_WR: c_int = 1;
        const IBV_SRQ_LIMIT: c_int = 2;
        let max_wr = (mask & IBV_SRQ_MAX_WR != 0).then_some(a.max_wr);
        let limit = (mask & IBV_SRQ_LIMIT != 0).then_some(a.srq_limit);
        x.srq.modify(max_wr, limit).map_or_else(|e| errno_of(&e), |_| 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(s: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    command(|| {
        // SAFETY: a live SRQ and a writable output.
        let x = unsafe { &*(s as *const Srq) };
        match x.srq.query() {
            Ok(q) => {
                // SAFETY: as above.
                unsafe {
                    std::ptr::write(attr, ibv_srq_attr { max_wr: q.max_wr, max_sge: q.max_sge, srq_limit: q.srq_limit })
                };
                0
            }
            Err(e) => errno_of(&e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(s: *mut ibv_srq) -> c_int {
    command(|| {
        // SAFETY: a live SRQ.
        let x = unsafe { &*(s as *const Srq) };
        // SAFETY: the SRQ's context is open.
        if unsafe { crate::context::left_by_fork(x.ibv.context) } {
            return 0;
        }
        if let Err(e) = x.srq.destroy() {
            return errno_of(&e);
        }
        if !x.xrcd.is_null() {
            // SAFETY: the domain handle stays open while the SRQ holds it.
            unsafe { crate::xrcd::xrcd(x.xrcd) }.release();
        }
        // SAFETY: the SRQ's context is open.
        let cx = unsafe { ctx(x.ibv.context) };
        cx.forget(softhca::EventElement::Srq(x.ibv.handle));
        // SAFETY: the SRQ's own fields.
        unsafe {
            wait_for_acks(
                cx,
                s as usize,
                std::ptr::addr_of_mut!((*s).mutex),
                std::ptr::addr_of_mut!((*s).cond),
                std::ptr::addr_of!((*s).events_completed),
            )
        };
        // SAFETY: from ibv_create_srq's Box::into_raw, freed once.
        drop(unsafe { Box::from_raw(s as *mut Srq) });
        0
    })
}
