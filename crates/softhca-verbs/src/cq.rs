//! Completion channels and completion queues: create, destroy, poll, notification, events.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

use softhca::{CompChannel, Cq as SoftCq, NotifyKind, Wc, WcOpcode, WcStatus};

use crate::abi::*;
use crate::device::{acknowledge, ctx, wait_for_acks, wait_until};
use crate::{errno_of, fail, set_errno};

#[repr(C)]
struct Channel {
    ibv: ibv_comp_channel,
    ch: CompChannel,
    /// The C CQs on this channel, by softhca handle: what a completion event names.
    cqs: Mutex<HashMap<u32, usize>>,
}

#[repr(C)]
pub(crate) struct Cq {
    pub ibv: ibv_cq,
    pub cq: SoftCq,
    /// Completion events `ibv_get_cq_event` returned for this CQ (counted under the channel's
    /// map lock); Destroy CQ waits until the program acknowledged as many.
    delivered: std::sync::atomic::AtomicU32,
}

/// # Safety
/// `c` comes from [`ibv_create_cq`] and is not destroyed.
pub(crate) unsafe fn cq<'a>(c: *mut ibv_cq) -> &'a Cq {
    // SAFETY: `ibv` is the first field of the repr(C) Cq the pointer was made from.
    unsafe { &*(c as *const Cq) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
    // SAFETY: an open context.
    let c = unsafe { ctx(context) };
    match c.ctx.create_comp_channel() {
        Ok(ch) => {
            // libibverbs' channel descriptor blocks until the program makes it non-blocking;
            // softhca's is created non-blocking (it only ever reads a count it knows is there,
            // so blocking mode is safe for it).
            let fd = ch.fd();
            crate::make_blocking(fd);
            let ibv = ibv_comp_channel { context, fd, refcnt: 0 };
            Box::into_raw(Box::new(Channel { ibv, ch, cqs: Mutex::new(HashMap::new()) })).cast()
        }
        Err(e) => fail(errno_of(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    // SAFETY: a live channel from ibv_create_comp_channel.
    let ch = unsafe { &*(channel as *const Channel) };
    if !ch.cqs.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
        return libc::EBUSY;
    }
    // SAFETY: from Box::into_raw, freed once.
    drop(unsafe { Box::from_raw(channel as *mut Channel) });
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut ibv_cq {
    // SAFETY: an open context.
    let c = unsafe { ctx(context) };
    let Ok(size) = u32::try_from(cqe) else { return fail(libc::EINVAL) };
    // SAFETY: a live channel or null.
    let ch = (!channel.is_null()).then(|| unsafe { &*(channel as *const Channel) });
    let soft = match c.ctx.create_cq_with_channel(size, ch.map(|ch| &ch.ch)) {
        Ok(cq) => cq,
        Err(e) => return fail(errno_of(&e)),
    };
    let ibv = ibv_cq {
        context,
        channel,
        cq_context,
        handle: soft.handle(),
        cqe: soft.query().map_or(cqe, |n| n.min(i32::MAX as u32) as c_int),
        // SAFETY: all-zero pthread objects are their static initializers on Linux.
        mutex: unsafe { std::mem::zeroed() },
        // SAFETY: as above.
        cond: unsafe { std::mem::zeroed() },
        comp_events_completed: 0,
        async_events_completed: 0,
    };
    let handle = soft.handle();
    let p = Box::into_raw(Box::new(Cq { ibv, cq: soft, delivered: Default::default() }));
    if let Some(ch) = ch {
        ch.cqs.lock().unwrap_or_else(|e| e.into_inner()).insert(handle, p as usize);
    }
    c.objects.lock().unwrap_or_else(|e| e.into_inner()).cqs.insert(handle, p as usize);
    p.cast()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(c: *mut ibv_cq) -> c_int {
    // SAFETY: a live CQ; only its Rust half and fields no other thread writes are read
    // through this reference (the counters and pthread objects are used in place below).
    let q = unsafe { cq(c) };
    if let Err(e) = q.cq.destroy() {
        return errno_of(&e);
    }
    let (handle, channel, context) = (q.ibv.handle, q.ibv.channel, q.ibv.context);
    if !channel.is_null() {
        // SAFETY: the channel outlives its CQs (destroying it is refused while it has any).
        let ch = unsafe { &*(channel as *const Channel) };
        ch.cqs.lock().unwrap_or_else(|e| e.into_inner()).remove(&handle);
        // As libibverbs: wait until every event handed out for this CQ was acknowledged, so
        // that no thread still holds it from ibv_get_cq_event when it is freed. (No event
        // can be handed out any more: the CQ left the channel's map above.)
        // SAFETY: the atomic counter of a live CQ, reached without a reference to the rest.
        let delivered = unsafe { &*std::ptr::addr_of!((*(c as *const Cq)).delivered) }.load(Ordering::SeqCst);
        // SAFETY: the CQ's own mutex, condition variable and counter, used in place.
        unsafe {
            wait_until(
                std::ptr::addr_of_mut!((*c).mutex),
                std::ptr::addr_of_mut!((*c).cond),
                std::ptr::addr_of!((*c).comp_events_completed),
                delivered,
            )
        };
    }
    // SAFETY: the CQ's context is open.
    let cx = unsafe { ctx(context) };
    cx.objects.lock().unwrap_or_else(|e| e.into_inner()).cqs.remove(&handle);
    // SAFETY: the CQ's own fields.
    unsafe {
        wait_for_acks(
            cx,
            c as usize,
            std::ptr::addr_of_mut!((*c).mutex),
            std::ptr::addr_of_mut!((*c).cond),
            std::ptr::addr_of!((*c).async_events_completed),
        )
    };
    // SAFETY: from ibv_create_cq's Box::into_raw, freed once.
    drop(unsafe { Box::from_raw(c as *mut Cq) });
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(c: *mut ibv_cq, cqe: c_int) -> c_int {
    // SAFETY: a live CQ.
    let q = unsafe { cq(c) };
    let Ok(size) = u32::try_from(cqe) else { return libc::EINVAL };
    match q.cq.resize(size) {
        Ok(n) => {
            // SAFETY: `cqe` is the program's to read; written in place, under the CQ's
            // mutex as libibverbs does, without a reference to the shared object.
            unsafe {
                let m = std::ptr::addr_of_mut!((*c).mutex);
                libc::pthread_mutex_lock(m);
                std::ptr::addr_of_mut!((*c).cqe).write(n.min(i32::MAX as u32) as c_int);
                libc::pthread_mutex_unlock(m);
            }
            0
        }
        Err(e) => errno_of(&e),
    }
}

/// Waits for the next completion event of `channel` (a blocking read of its descriptor,
/// unless the program made that non-blocking: then EAGAIN when none waits).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    // SAFETY: a live channel.
    let ch = unsafe { &*(channel as *const Channel) };
    let nonblocking = crate::nonblocking(ch.ibv.fd);
    let p = loop {
        let ev = if nonblocking { ch.ch.try_get_cq_event() } else { ch.ch.get_cq_event(Duration::from_secs(3600)) };
        let got = match ev {
            Some(cq) => cq,
            None if nonblocking => {
                set_errno(libc::EAGAIN);
                return -1;
            }
            None => continue,
        };
        let map = ch.cqs.lock().unwrap_or_else(|e| e.into_inner());
        // An event of a CQ destroyed since it was queued names nothing: the next one.
        let Some(&p) = map.get(&got.handle()) else { continue };
        // Counted before the map lock is released: a Destroy CQ that removes it afterwards
        // waits for this event's acknowledgement.
        // SAFETY: in the map, so not yet destroyed; only the atomic counter is referenced.
        unsafe { &*std::ptr::addr_of!((*(p as *const Cq)).delivered) }.fetch_add(1, Ordering::SeqCst);
        break p as *mut Cq;
    };
    // SAFETY: `p` stays live until the program acknowledges this event (see Destroy CQ); the
    // out-pointers are writable.
    unsafe {
        *cq_out = p.cast();
        *cq_context = (*p).ibv.cq_context;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(c: *mut ibv_cq, nevents: c_uint) {
    // SAFETY: a live CQ; the count is updated in place under the CQ's mutex, as libibverbs
    // does, without a reference to the shared object.
    unsafe {
        acknowledge(
            std::ptr::addr_of_mut!((*c).mutex),
            std::ptr::addr_of_mut!((*c).cond),
            std::ptr::addr_of_mut!((*c).comp_events_completed),
            nevents,
        )
    }
}

pub(crate) unsafe extern "C" fn req_notify_cq(c: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: a live CQ.
    let q = unsafe { cq(c) };
    let kind = if solicited_only != 0 { NotifyKind::Solicited } else { NotifyKind::NextCompletion };
    q.cq.req_notify(kind).map_or_else(|e| errno_of(&e), |_| 0)
}

fn wc_opcode(o: WcOpcode) -> c_int {
    match o {
        WcOpcode::Send => 0,
        WcOpcode::RdmaWrite => 1,
        WcOpcode::RdmaRead => 2,
        WcOpcode::CompSwap => 3,
        WcOpcode::FetchAdd => 4,
        WcOpcode::BindMw => 5,
        WcOpcode::LocalInv => 6,
        WcOpcode::Recv => IBV_WC_RECV,
        WcOpcode::RecvRdmaWithImm => IBV_WC_RECV + 1,
    }
}

fn wc_status(s: WcStatus) -> c_int {
    // softhca's statuses are ibv_wc_status in order.
    s as c_int
}

fn c_wc(w: &Wc) -> ibv_wc {
    ibv_wc {
        wr_id: w.wr_id,
        status: wc_status(w.status),
        opcode: wc_opcode(w.opcode),
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        // Immediate data travels in network order; an invalidated R_Key does not.
        imm_data: if w.wc_flags.contains(softhca::WcFlags::WITH_INV) { w.imm_data } else { w.imm_data.to_be() },
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags.bits(),
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
    }
}

pub(crate) unsafe extern "C" fn poll_cq(c: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: a live CQ.
    let q = unsafe { cq(c) };
    let want = usize::try_from(num_entries).unwrap_or(0);
    let mut buf = [Wc::default(); 16];
    let mut got = 0;
    while got < want {
        let n = match q.cq.poll(&mut buf[..(want - got).min(16)]) {
            Ok(n) => n,
            Err(_) if got == 0 => return -1,
            Err(_) => break,
        };
        for (k, w) in buf[..n].iter().enumerate() {
            // SAFETY: the caller's array holds num_entries completions; got + k < num_entries.
            unsafe { std::ptr::write(wc.add(got + k), c_wc(w)) };
        }
        got += n;
        if n < 16 {
            break;
        }
    }
    got as c_int
}
