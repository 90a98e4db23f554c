//! An id's QP, SRQ and endpoint, as librdmacm makes them: `rdma_create_qp(_ex)` (CQs and
//! completion channels when the program gives none, the QP moved to INIT, or to RTS for UD),
//! `rdma_destroy_qp`, SRQs, `rdma_create_ep` / `rdma_destroy_ep`.

use std::ffi::c_int;
use std::ptr::null_mut;

use super::abi::*;
use super::api::*;
use super::*;
use crate::abi::*;

/// librdmacm's `ucma_create_cqs`: a completion channel and a CQ for each missing CQ.
pub(super) unsafe fn create_cqs(id: &mut Id, send: u32, recv: u32) -> Result<(), c_int> {
    let ctx = id.c.verbs;
    for (size, channel, cq) in
        [(recv, &mut id.c.recv_cq_channel, &mut id.c.recv_cq), (send, &mut id.c.send_cq_channel, &mut id.c.send_cq)]
    {
        if size == 0 || !cq.is_null() {
            continue;
        }
        // SAFETY: the id's live context.
        *channel = unsafe { crate::cq::ibv_create_comp_channel(ctx) };
        if channel.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: as above, with the channel just made.
        *cq = unsafe { crate::cq::ibv_create_cq(ctx, size.max(1) as c_int, null_mut(), *channel, 0) };
        if cq.is_null() {
            // SAFETY: errno of this thread, just set.
            return Err(unsafe { *libc::__errno_location() });
        }
    }
    Ok(())
}

/// librdmacm's `ucma_get_xrcd`: the device's XRC domain for XRC ids that name none, opened
/// (private, fd -1) on first use and kept for the process.
fn device_xrcd(g: &mut Global) -> Result<*mut ibv_xrcd, c_int> {
    let dev = g.dev.as_mut().ok_or(libc::ENODEV)?;
    if dev.xrcd.is_null() {
        let mut attr = ibv_xrcd_init_attr {
            comp_mask: IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
            fd: -1,
            oflags: libc::O_CREAT,
        };
        // SAFETY: the device's open context; a local attribute structure.
        dev.xrcd = unsafe { crate::xrcd::open_xrcd(dev.ctx, &mut attr) };
        if dev.xrcd.is_null() {
            // SAFETY: errno of this thread, just set.
            return Err(unsafe { *libc::__errno_location() });
        }
    }
    Ok(dev.xrcd)
}

/// librdmacm's `ucma_destroy_cqs`: the CQs and channels in the id's fields, whoever put them
/// there (librdmacm's `rdma_create_qp`, or a program such as the rsocket layer), each once;
/// not an XRC target's while its SRQ (which completes on them) is there. One the library
/// refuses to destroy (a QP or SRQ still uses it) stays in the id, which still has it, until
/// the program destroys it itself (`forget_cq`).
pub(super) unsafe fn destroy_cqs(id: &mut Id) {
    if id.c.qp_type == IBV_QPT_XRC_RECV && !id.c.srq.is_null() {
        return;
    }
    let c = &mut id.c;
    // SAFETY (each call): CQs and channels of this library that the id holds.
    destroy_pair(&mut c.recv_cq, &mut c.send_cq, |cq| unsafe { crate::cq::destroy_cq(cq, false) } == 0);
    destroy_pair(
        &mut c.recv_cq_channel,
        &mut c.send_cq_channel,
        |ch| unsafe { crate::cq::destroy_comp_channel(ch, false) } == 0,
    );
}

/// Destroys an id's receive and send object (its CQs, or its channels), the same one once,
/// and forgets each that `destroy` did destroy.
fn destroy_pair<T>(recv: &mut *mut T, send: &mut *mut T, destroy: impl Fn(*mut T) -> bool) {
    let shared = *send == *recv;
    if !recv.is_null() && destroy(*recv) {
        if shared {
            *send = null_mut();
        }
        *recv = null_mut();
    }
    if !send.is_null() && !shared && destroy(*send) {
        *send = null_mut();
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_create_qp(
    p: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    if attr.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the program's init attributes.
    let a = unsafe { &mut *attr };
    // SAFETY: an all-zero extended init structure is valid.
    let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    ex.qp_context = a.qp_context;
    ex.send_cq = a.send_cq;
    ex.recv_cq = a.recv_cq;
    ex.srq = a.srq;
    ex.cap = a.cap;
    ex.qp_type = a.qp_type;
    ex.sq_sig_all = a.sq_sig_all;
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = pd;
    // SAFETY: the program's id; a local structure.
    let rc = unsafe { softhca_rdma_create_qp_ex(p, &mut ex) };
    if rc == 0 {
        a.cap = ex.cap;
        a.send_cq = ex.send_cq;
        a.recv_cq = ex.recv_cq;
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_create_qp_ex(p: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    if attr.is_null() || id.c.verbs.is_null() || !id.c.qp.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the program's init attributes.
    let a = unsafe { &mut *attr };
    let mut g = global();
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.pd = id.c.pd;
        a.comp_mask |= IBV_QP_INIT_ATTR_PD;
    // SAFETY: the program's PD.
    } else if unsafe { (*a.pd).context } != id.c.verbs {
        return err(libc::EINVAL);
    }
    if a.pd.is_null() {
        return err(libc::EINVAL);
    }
    // librdmacm: a CQ the id already has (the rsocket layer's, an XRC SRQ's) is the QP's; a
    // program naming another is refused.
    let differs = |mine: *mut ibv_cq, given: *mut ibv_cq| !mine.is_null() && !given.is_null() && mine != given;
    if differs(id.c.recv_cq, a.recv_cq) || differs(id.c.send_cq, a.send_cq) {
        return err(libc::EINVAL);
    }
    if id.c.qp_type == IBV_QPT_XRC_RECV && (a.comp_mask & IBV_QP_INIT_ATTR_XRCD == 0 || a.xrcd.is_null()) {
        match device_xrcd(&mut g) {
            Ok(x) => a.xrcd = x.cast(),
            Err(e) => return err(e),
        }
        a.comp_mask |= IBV_QP_INIT_ATTR_XRCD;
    }
    if a.srq.is_null() {
        a.srq = id.c.srq;
    }
    // An XRC initiator has no receive side: no receive CQ is made for it (librdmacm makes CQs
    // for the sizes asked, and XRC programs ask for no receives).
    let xrc_send = a.qp_type == IBV_QPT_XRC_SEND;
    let made = a.send_cq.is_null() || (a.recv_cq.is_null() && !xrc_send);
    if made {
        let recv = if a.recv_cq.is_null() && a.srq.is_null() { a.cap.max_recv_wr } else { 0 };
        let recv = if xrc_send { 0 } else { recv.max(u32::from(a.recv_cq.is_null())) };
        let send = if a.send_cq.is_null() { a.cap.max_send_wr } else { 0 };
        // SAFETY: the id's context.
        if let Err(e) = unsafe { create_cqs(id, send, recv) } {
            // SAFETY: the CQs just made.
            unsafe { destroy_cqs(id) };
            return err(e);
        }
        if a.send_cq.is_null() {
            a.send_cq = id.c.send_cq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = id.c.recv_cq;
        }
    }
    // SAFETY: the id's context and attributes checked above.
    let qp = unsafe { crate::qp::create_qp_ex(id.c.verbs, a) };
    if qp.is_null() {
        // SAFETY: errno of this thread, just set.
        let e = unsafe { *libc::__errno_location() };
        if made {
            // SAFETY: the CQs just made.
            unsafe { destroy_cqs(id) };
        }
        return err(e);
    }
    id.c.qp = qp;
    id.c.pd = a.pd;
    // librdmacm's ucma_init_conn_qp / ucma_init_ud_qp.
    let states: &[c_int] =
        if a.qp_type == IBV_QPT_UD { &[IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS] } else { &[IBV_QPS_INIT] };
    for &s in states {
        let r = g.qp_attr(id, s).and_then(|(mut qa, mask)| {
            // SAFETY: the QP just made.
            match unsafe { crate::qp::ibv_modify_qp(qp, &mut qa, mask) } {
                0 => Ok(()),
                e => Err(e),
            }
        });
        if let Err(e) = r {
            drop(g);
            // SAFETY: the QP just made, and the id's own CQs.
            unsafe { softhca_rdma_destroy_qp(p) };
            return err(e);
        }
    }
    drop(g);
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_destroy_qp(p: *mut rdma_cm_id) {
    // SAFETY: the program's id.
    let Ok(id) = (unsafe { id_of(p) }) else { return };
    let _g = global();
    if !id.c.qp.is_null() {
        // SAFETY: the id's QP, taken out under the lock the CM thread moves it under (which
        // is why the id is cleared here and not by `forget_qp`).
        unsafe { crate::qp::destroy_qp(id.c.qp, false) };
        id.c.qp = null_mut();
    }
    // SAFETY: the CQs the id holds.
    unsafe { destroy_cqs(id) };
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_create_srq(
    p: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    if attr.is_null() || id.c.verbs.is_null() {
        return err(libc::EINVAL);
    }
    let pd = if pd.is_null() { id.c.pd } else { pd };
    if id.c.qp_type == IBV_QPT_XRC_RECV {
        // librdmacm's rdma_create_srq: an XRC id's SRQ is an XRC SRQ.
        // SAFETY: the program's attributes; an all-zero extended structure is valid.
        let mut ex: ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: the program's attributes.
        let a = unsafe { &mut *attr };
        (ex.srq_context, ex.attr) = (a.srq_context, a.attr);
        ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
        (ex.srq_type, ex.pd) = (IBV_SRQT_XRC, pd);
        // SAFETY: the program's id; a local structure.
        let rc = unsafe { softhca_rdma_create_srq_ex(p, &mut ex) };
        a.attr = ex.attr;
        return rc;
    }
    if pd.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: a PD of the id's context and the program's attributes.
    let srq = unsafe { crate::qp::ibv_create_srq(pd, attr) };
    if srq.is_null() {
        return -1;
    }
    id.c.srq = srq;
    id.c.pd = pd;
    0
}

/// librdmacm's `rdma_create_srq_ex`: the SRQ type must be given (EINVAL), the id's PD by
/// default; an XRC SRQ gets the device's XRC domain and the id's receive CQ (made if the id
/// has none) unless the program names them; then `ibv_create_srq_ex` makes it (a
/// tag-matching one is EOPNOTSUPP, as the drop-in's libibverbs answers).
#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_create_srq_ex(p: *mut rdma_cm_id, attr: *mut ibv_srq_init_attr_ex) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    if attr.is_null() || id.c.verbs.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the program's attributes.
    let a = unsafe { &mut *attr };
    if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 {
        return err(libc::EINVAL);
    }
    if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.pd = id.c.pd;
        a.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    }
    let mut g = global();
    let had_cq = !id.c.recv_cq.is_null();
    if a.srq_type == IBV_SRQT_XRC {
        if a.comp_mask & IBV_SRQ_INIT_ATTR_XRCD == 0 || a.xrcd.is_null() {
            match device_xrcd(&mut g) {
                Ok(x) => a.xrcd = x.cast(),
                Err(e) => return err(e),
            }
        }
        if a.comp_mask & IBV_SRQ_INIT_ATTR_CQ == 0 || a.cq.is_null() {
            // SAFETY: the id's context.
            if let Err(e) = unsafe { create_cqs(id, 0, a.attr.max_wr) } {
                if !had_cq {
                    // SAFETY: what create_cqs made before it failed.
                    unsafe { destroy_cqs(id) };
                }
                return err(e);
            }
            // librdmacm makes the SRQ a CQ of its size; the id's receive CQ, made for its
            // target QP's (absent) receives, may be smaller: it grows (the target QP holds it
            // not).
            // SAFETY: the id's live CQ.
            if had_cq && unsafe { (*id.c.recv_cq).cqe } < a.attr.max_wr as c_int {
                // SAFETY: as above.
                let rc = unsafe { crate::cq::ibv_resize_cq(id.c.recv_cq, a.attr.max_wr as c_int) };
                if rc != 0 {
                    return err(rc);
                }
            }
            a.cq = id.c.recv_cq;
        }
        a.comp_mask |= IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    }
    // SAFETY: the id's open context and the program's attributes.
    let srq = unsafe { crate::qp::create_srq_ex(id.c.verbs, attr) };
    if srq.is_null() {
        // SAFETY: errno of this thread, just set.
        let e = unsafe { *libc::__errno_location() };
        if !had_cq && id.c.qp.is_null() {
            // SAFETY: the CQs made above for the SRQ.
            unsafe { destroy_cqs(id) };
        }
        return err(e);
    }
    if id.c.pd.is_null() {
        id.c.pd = a.pd;
    }
    id.c.srq = srq;
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_destroy_srq(p: *mut rdma_cm_id) {
    // SAFETY: the program's id.
    let Ok(id) = (unsafe { id_of(p) }) else { return };
    if !id.c.srq.is_null() {
        // SAFETY: the id's SRQ.
        unsafe { crate::qp::ibv_destroy_srq(id.c.srq) };
        id.c.srq = null_mut();
    }
    // librdmacm's rdma_destroy_srq: then the id's CQs (an XRC target's were kept for its SRQ;
    // one a QP still uses stays, as the kernel refuses it).
    // SAFETY: the CQs the id holds.
    unsafe { destroy_cqs(id) };
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_get_request(listen: *mut rdma_cm_id, out: *mut *mut rdma_cm_id) -> c_int {
    // SAFETY: the program's id.
    let l = match unsafe { id_of(listen) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    if out.is_null() || !l.sync || global().id(l.serial).is_none_or(|l| l.st.phase != Phase::Listen) {
        return err(libc::EINVAL);
    }
    if !l.c.event.is_null() {
        // SAFETY: the event kept from the listener's last failed call.
        unsafe { softhca_rdma_ack_cm_event(l.c.event) };
        l.c.event = null_mut();
    }
    let mut ev = null_mut();
    // SAFETY: the listener's own channel; a local out pointer.
    if unsafe { softhca_rdma_get_cm_event(l.c.channel, &mut ev) } != 0 {
        return -1;
    }
    // SAFETY: the event just taken.
    let e = unsafe { &mut *ev };
    if e.status != 0 || e.event != RDMA_CM_EVENT_CONNECT_REQUEST {
        let code = if e.status != 0 { e.status.abs() } else { libc::EINVAL };
        // SAFETY: the event just taken.
        unsafe { softhca_rdma_ack_cm_event(ev) };
        return err(code);
    }
    // SAFETY: a CONNECT_REQUEST's id is the new one, live until the program destroys it.
    let new = unsafe { &mut *(e.id as *mut Id) };
    let qp_init = global().id(new.serial).and_then(|n| n.st.qp_init.take());
    if let Some(mut attr) = qp_init {
        // SAFETY: the new id and the listener's QP attributes (their PD is the listener's).
        if unsafe { softhca_rdma_create_qp(&mut new.c, l.c.pd, &mut attr) } != 0 {
            // SAFETY: errno of this thread, just set.
            let code = unsafe { *libc::__errno_location() };
            // SAFETY: as above.
            unsafe {
                reject(&mut new.c, std::ptr::null(), 0, REJ_CONSUMER);
                softhca_rdma_ack_cm_event(ev);
                softhca_rdma_destroy_id(&mut new.c);
            }
            return err(code);
        }
    }
    new.c.event = ev;
    // SAFETY: the program's out pointer.
    unsafe { *out = &mut new.c };
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_create_ep(
    out: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init: *mut ibv_qp_init_attr,
) -> c_int {
    if out.is_null() || res.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the program's address information.
    let r = unsafe { &*res };
    let mut p = null_mut();
    // SAFETY: a local out pointer.
    if unsafe { create_id(null_mut(), &mut p, null_mut(), r.ai_port_space, r.ai_qp_type) } != 0 {
        return -1;
    }
    // SAFETY: as the calls' contracts say; every failure destroys the id and keeps errno.
    let rc = unsafe {
        if r.ai_flags & RAI_PASSIVE != 0 {
            let rc = softhca_rdma_bind_addr(p, r.ai_src_addr);
            let id = &mut *(p as *mut Id);
            if rc == 0 && !pd.is_null() {
                id.c.pd = pd;
            }
            if rc == 0 && !qp_init.is_null() {
                let mut a = copy_init(&*qp_init);
                a.qp_type = r.ai_qp_type;
                let _g = global();
                id.st.qp_init = Some(a);
            }
            rc
        } else {
            let mut rc = softhca_rdma_resolve_addr(p, r.ai_src_addr, r.ai_dst_addr, 2000);
            if rc == 0 {
                rc = softhca_rdma_resolve_route(p, 2000);
            }
            if rc == 0 && !qp_init.is_null() {
                (*qp_init).qp_type = r.ai_qp_type;
                rc = softhca_rdma_create_qp(p, pd, qp_init);
            }
            rc
        }
    };
    if rc != 0 {
        // SAFETY: errno of this thread, just set.
        let e = unsafe { *libc::__errno_location() };
        // SAFETY: the id just made.
        unsafe { softhca_rdma_destroy_id(p) };
        return err(e);
    }
    // SAFETY: the program's out pointer.
    unsafe { *out = p };
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_destroy_ep(p: *mut rdma_cm_id) {
    // A stale or stray id (a second destroy) is not read (librdmacm reads it).
    // SAFETY: checked against the live ids.
    if unsafe { super::id_of(p) }.is_err() {
        return;
    }
    // SAFETY: the program's id and what it holds.
    unsafe {
        if !(*p).qp.is_null() {
            softhca_rdma_destroy_qp(p);
        }
        if !(*p).srq.is_null() {
            softhca_rdma_destroy_srq(p);
        }
        softhca_rdma_destroy_id(p);
    }
}
