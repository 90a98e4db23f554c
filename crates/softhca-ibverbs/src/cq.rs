//! Completion channels and completion queues: create, destroy, poll, notification, events,
//! and the extended CQ (`ibv_create_cq_ex`) with its polling interface (`ibv_start_poll`,
//! `ibv_next_poll`, `ibv_end_poll`, `ibv_wc_read_*`). Every CQ is laid out as an `ibv_cq_ex`
//! (an `ibv_cq` followed by the polling entries), so both kinds share one type and one ring.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, OnceLock};

use softhca::{CompChannel, Cq as SoftCq, NotifyKind, Wc, WcOpcode, WcStatus};

use crate::abi::*;
use crate::context::{acknowledge, ctx, wait_for_acks, wait_until};
use crate::{command, errno_of, fail, set_errno};

#[repr(C)]
struct Channel {
    ibv: ibv_comp_channel,
    ch: CompChannel,
    /// The C CQs on this channel, by softhca handle: what a completion event names.
    cqs: Mutex<HashMap<u32, usize>>,
}

#[repr(C)]
pub(crate) struct Cq {
    pub ibv: ibv_cq_ex,
    pub cq: SoftCq,
    /// Completion events `ibv_get_cq_event` returned for this CQ (counted under the channel's
    /// map lock); Destroy CQ waits until the program acknowledged as many.
    delivered: std::sync::atomic::AtomicU32,
    /// The completion the extended polling interface is on, and when it was read
    /// (CLOCK_MONOTONIC and CLOCK_REALTIME nanoseconds, taken where asked for).
    current: Mutex<(Wc, u64, u64)>,
    /// The `IBV_WC_EX_WITH_*` fields the program asked for at creation.
    wc_flags: u64,
    /// Held from a successful `ibv_start_poll` to `ibv_end_poll`: the poll batch, and so
    /// `current`, is its poller's.
    poller: crate::Gate,
    /// The parent domain it was made with (`IBV_CQ_INIT_ATTR_MASK_PD`), which it holds; or
    /// null.
    parent_domain: *mut ibv_pd,
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

/// What a program's destroy of a CQ or completion channel tells: rdma_cm forgets it in the
/// ids that name it (as it forgets a destroyed QP), so that no later `rdma_destroy_qp` destroys
/// it again. Called with the object's address while it is still allocated.
static ON_DESTROY: OnceLock<fn(*mut c_void)> = OnceLock::new();

/// Registers [`ON_DESTROY`]'s hook (the first registration stays).
pub(crate) fn on_destroy(hook: fn(*mut c_void)) {
    let _ = ON_DESTROY.set(hook);
}

fn destroyed(object: *mut c_void, forget: bool) {
    if let Some(hook) = ON_DESTROY.get().filter(|_| forget) {
        hook(object);
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    // SAFETY: as the caller promises.
    unsafe { destroy_comp_channel(channel, true) }
}

/// Destroy Completion Channel; `forget` runs [`ON_DESTROY`]'s hook. rdma_cm, which holds its
/// lock and clears its ids itself, passes false.
///
/// # Safety
/// `channel` is a live channel from ibv_create_comp_channel.
pub(crate) unsafe fn destroy_comp_channel(channel: *mut ibv_comp_channel, forget: bool) -> c_int {
    // SAFETY: a live channel from ibv_create_comp_channel.
    let ch = unsafe { &*(channel as *const Channel) };
    // SAFETY: the channel's context is open.
    if unsafe { crate::context::left_by_fork((*channel).context) } {
        return 0;
    }
    if !ch.cqs.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
        return libc::EBUSY;
    }
    destroyed(channel.cast(), forget);
    // SAFETY: from Box::into_raw, freed once.
    drop(unsafe { Box::from_raw(channel as *mut Channel) });
    0
}

/// Creates a CQ of at least `cqe` entries; `wc_flags` are the extended fields asked for.
///
/// # Safety
/// `context` is open; `channel` is a live channel of it or null.
unsafe fn create(
    context: *mut ibv_context,
    cqe: u32,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    wc_flags: u64,
) -> *mut Cq {
    // SAFETY: an open context.
    let c = unsafe { ctx(context) };
    // SAFETY: a live channel or null.
    let ch = (!channel.is_null()).then(|| unsafe { &*(channel as *const Channel) });
    let soft = match c.ctx.create_cq_with_channel(cqe, ch.map(|ch| &ch.ch)) {
        Ok(cq) => cq,
        // libibverbs' drivers answer a CQ larger than the device's max_cqe with EINVAL.
        Err(softhca::VerbsError::CqSizeTooLarge) => return fail(libc::EINVAL),
        Err(e) => return fail(errno_of(&e)),
    };
    let base = ibv_cq {
        context,
        channel,
        cq_context,
        handle: soft.handle(),
        cqe: soft.query().map_or(0, |n| n.min(i32::MAX as u32) as c_int),
        // SAFETY: all-zero pthread objects are their static initializers on Linux.
        mutex: unsafe { std::mem::zeroed() },
        // SAFETY: as above.
        cond: unsafe { std::mem::zeroed() },
        comp_events_completed: 0,
        async_events_completed: 0,
    };
    let ibv = ibv_cq_ex {
        base,
        comp_mask: 0,
        status: 0,
        wr_id: 0,
        start_poll: Some(start_poll),
        next_poll: Some(next_poll),
        end_poll: Some(end_poll),
        read_opcode: Some(read_opcode),
        read_vendor_err: Some(read_vendor_err),
        read_byte_len: Some(read_byte_len),
        read_imm_data: Some(read_imm_data),
        read_qp_num: Some(read_qp_num),
        read_src_qp: Some(read_src_qp),
        read_wc_flags: Some(read_wc_flags),
        read_slid: Some(read_slid),
        read_sl: Some(read_sl),
        read_dlid_path_bits: Some(read_dlid_path_bits),
        read_completion_ts: (wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP != 0).then_some(read_completion_ts),
        read_cvlan: None,
        read_flow_tag: None,
        read_tm_info: std::ptr::null_mut(),
        read_completion_wallclock_ns: (wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK != 0)
            .then_some(read_completion_wallclock_ns),
    };
    let handle = soft.handle();
    let cq = Cq {
        ibv,
        cq: soft,
        delivered: Default::default(),
        current: Mutex::new((Wc::default(), 0, 0)),
        wc_flags,
        poller: Default::default(),
        parent_domain: std::ptr::null_mut(),
    };
    let p = Box::into_raw(Box::new(cq));
    if let Some(ch) = ch {
        ch.cqs.lock().unwrap_or_else(|e| e.into_inner()).insert(handle, p as usize);
    }
    c.objects.lock().unwrap_or_else(|e| e.into_inner()).cqs.insert(handle, p as usize);
    p
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    let Ok(size) = u32::try_from(cqe) else { return fail(libc::EINVAL) };
    // SAFETY: an open context.
    if !unsafe { valid_comp_vector(context, comp_vector as u32) } {
        return fail(libc::EINVAL);
    }
    // SAFETY: an open context and a channel of it or null, as the caller promises.
    unsafe { create(context, size, cq_context, channel, 0) }.cast()
}

/// Whether `vector` is one of the context's completion vectors (the kernel refuses any
/// other with EINVAL; a negative `int` is a huge `__u32` there).
///
/// # Safety
/// `context` is open.
unsafe fn valid_comp_vector(context: *mut ibv_context, vector: u32) -> bool {
    // SAFETY: as the caller promises.
    i64::from(vector) < i64::from(unsafe { (*context).num_comp_vectors })
}

/// The `IBV_WC_EX_WITH_*` fields softhca fills: the standard ones and both timestamps (no
/// VLAN, flow tag or tag-matching information: softhca has none of those).
const SUPPORTED_WC_FLAGS: u64 = IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS
    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

/// `verbs_context.create_cq_ex`: unknown `comp_mask` bits are EINVAL (libibverbs' command
/// check); single-threaded use, a hint, is accepted; a CQ that ignores overrun (no error
/// state, the entry written over) is EOPNOTSUPP, as on Linux rxe: softhca's CQ always checks
/// (CQ Error, its QPs to Error). A parent domain does not exist here (EOPNOTSUPP), nor do
/// fields softhca cannot fill.
pub(crate) unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a readable attribute structure.
    let a = unsafe { &*attr };
    if a.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0 {
        return fail(libc::EINVAL);
    }
    if a.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    // A CQ in a domain takes a parent domain (mlx5: EINVAL for anything else).
    let in_domain = a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0;
    // SAFETY: the program's PD object, or null.
    if in_domain && !unsafe { crate::domain::is_parent(a.parent_domain) } {
        return fail(libc::EINVAL);
    }
    let parent_domain = if in_domain { a.parent_domain } else { std::ptr::null_mut() };
    if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 && a.flags & !IBV_CREATE_CQ_ATTR_SINGLE_THREADED != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: an open context (verbs.h found the op in it).
    if !unsafe { valid_comp_vector(context, a.comp_vector) } {
        return fail(libc::EINVAL);
    }
    // SAFETY: an open context (verbs.h found the op in it); the channel is the program's.
    let c = unsafe { create(context, a.cqe, a.cq_context, a.channel, a.wc_flags) };
    if !c.is_null() && !parent_domain.is_null() {
        // SAFETY: the CQ just made, not yet the program's; a live parent domain.
        unsafe {
            (*c).parent_domain = parent_domain;
            crate::domain::hold(parent_domain);
        }
    }
    c.cast()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(c: *mut ibv_cq) -> c_int {
    // SAFETY: as the caller promises.
    unsafe { destroy_cq(c, true) }
}

/// Destroy CQ; `forget` runs [`ON_DESTROY`]'s hook, as [`destroy_comp_channel`].
///
/// # Safety
/// `c` is a live CQ of this library.
pub(crate) unsafe fn destroy_cq(c: *mut ibv_cq, forget: bool) -> c_int {
    command(|| {
        // SAFETY: a live CQ; only its Rust half and fields no other thread writes are read
        // through this reference (the counters and pthread objects are used in place below).
        let q = unsafe { cq(c) };
        // SAFETY: the CQ's context is open.
        if unsafe { crate::context::left_by_fork((*c).context) } {
            return 0;
        }
        if let Err(e) = q.cq.destroy() {
            return errno_of(&e);
        }
        destroyed(c.cast(), forget);
        // SAFETY: the parent domain the CQ holds, live until released here.
        unsafe { crate::domain::release(q.parent_domain) };
        let (handle, channel, context) = (q.ibv.base.handle, q.ibv.base.channel, q.ibv.base.context);
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
        cx.forget(softhca::EventElement::Cq(handle));
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
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(c: *mut ibv_cq, cqe: c_int) -> c_int {
    command(|| {
        // SAFETY: a live CQ.
        let q = unsafe { cq(c) };
        let Ok(size) = u32::try_from(cqe) else { return libc::EINVAL };
        // Linux's rxe runs a user QP's send queue in the `ibv_post_send` system call and writes a
        // UD or UC send's completion right after its packet: by the time a program resizes, what
        // it posted before has completed, and counts against the new size. Here the engine thread
        // sends; the resize first gives it the time to, as long as Destroy QP does
        // (`SETTLE_MAX`: 10 ms, the bound before, is less than a loaded machine can hold the
        // engine thread back, and the resize then took the sends' completions for not there).
        // SAFETY: the CQ's context is open.
        let device = &unsafe { ctx(q.ibv.base.context) }.ctx;
        crate::settle(|| device.unsent(), crate::SETTLE_MAX);
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
            // Past the device's max_cqe: the kernel's EINVAL (Create CQ's too).
            Err(softhca::VerbsError::CqSizeTooLarge) => libc::EINVAL,
            Err(e) => errno_of(&e),
        }
    })
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
        if !nonblocking {
            if let Err(e) = crate::wait_event(ch.ibv.fd) {
                set_errno(e);
                return -1;
            }
        }
        let got = match ch.ch.try_get_cq_event() {
            Some(cq) => cq,
            None if nonblocking => {
                set_errno(libc::EAGAIN);
                return -1;
            }
            None => continue, // another thread took it, or its CQ was destroyed: wait again
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
        *cq_context = (*p).ibv.base.cq_context;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(c: *mut ibv_cq, nevents: c_uint) {
    // SAFETY: a live CQ of an open context.
    if unsafe { crate::context::left_by_fork((*c).context) } {
        return; // the CQ's mutex is as the fork left it
    }
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
    command(|| {
        // SAFETY: a live CQ.
        let q = unsafe { cq(c) };
        let kind = if solicited_only != 0 { NotifyKind::Solicited } else { NotifyKind::NextCompletion };
        q.cq.req_notify(kind).map_or_else(|e| errno_of(&e), |_| 0)
    })
}

fn wc_opcode(o: WcOpcode) -> c_int {
    match o {
        WcOpcode::Send => 0,
        WcOpcode::RdmaWrite => 1,
        WcOpcode::RdmaRead => 2,
        WcOpcode::CompSwap => 3,
        WcOpcode::FetchAdd => 4,
        WcOpcode::AtomicWrite => 9,
        WcOpcode::BindMw => 5,
        WcOpcode::LocalInv => 6,
        // No C program can post a Fast Register (libibverbs has none): never produced here.
        // The registration opcode libibverbs has stands in.
        WcOpcode::FastReg => 5,
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
        sl: roce_sl(w),
        dlid_path_bits: w.dlid_path_bits,
    }
}

/// The SL a UD receive reports. No SL travels on RoCE; ConnectX's provider (libmlx5) reports
/// the packet's RoCE type there instead (bit 3: a UDP header, RoCEv2; bits 2:0 the L3 header,
/// 2 IPv4, 1 IPv6), and UCX's ud_verbs reads it to find the destination address in the GRH
/// area, dropping every packet it cannot place: with rxe's 0, UCX 1.13 drops all of IPv4. So
/// it is ConnectX's answer here.
fn roce_sl(w: &Wc) -> u8 {
    match w.network_hdr_type {
        softhca::NetworkHdrType::Ipv4 => 0x8 | 0x2,
        softhca::NetworkHdrType::Ipv6 => 0x8 | 0x1,
        softhca::NetworkHdrType::Ib => w.sl,
    }
}

pub(crate) unsafe extern "C" fn poll_cq(c: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: a live CQ.
    let q = unsafe { cq(c) };
    let want = usize::try_from(num_entries).unwrap_or(0);
    let took = q.cq.poll_with(want, |k, w| {
        // SAFETY: the caller's array holds num_entries completions, and k < num_entries.
        unsafe { std::ptr::write(wc.add(k), c_wc(w)) }
    });
    let Ok(got) = took else { return -1 };
    got as c_int
}

/// The CQ behind an extended CQ pointer.
///
/// # Safety
/// `c` comes from [`create_cq_ex`] (or [`ibv_create_cq`]) and is not destroyed.
unsafe fn cq_ex<'a>(c: *mut ibv_cq_ex) -> &'a Cq {
    // SAFETY: `ibv` (an ibv_cq_ex) is the first field of the repr(C) Cq.
    unsafe { &*(c as *const Cq) }
}

/// Nanoseconds of `clock`.
pub(crate) fn now_ns(clock: libc::clockid_t) -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the local timespec.
    unsafe { libc::clock_gettime(clock, &mut t) };
    (t.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(t.tv_nsec as u64)
}

/// Takes the next completion into the CQ's current slot and the program's `status` and
/// `wr_id`; ENOENT when the CQ is empty.
///
/// # Safety
/// `c` is a live CQ.
unsafe fn advance(c: *mut ibv_cq_ex) -> c_int {
    // SAFETY: a live CQ.
    let q = unsafe { cq_ex(c) };
    let mut one = [Wc::default()];
    match q.cq.poll(&mut one) {
        Ok(1) => {}
        Ok(_) => {
            crate::set_errno(libc::ENOENT); // as rxe's provider sets it too
            return libc::ENOENT;
        }
        Err(e) => return errno_of(&e),
    }
    let stamp = |flag, clock| if q.wc_flags & flag != 0 { now_ns(clock) } else { 0 };
    let mono = stamp(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP, libc::CLOCK_MONOTONIC);
    let wall = stamp(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK, libc::CLOCK_REALTIME);
    *q.current.lock().unwrap_or_else(|e| e.into_inner()) = (one[0], mono, wall);
    // SAFETY: the program's fields of its CQ, written in place as a provider does.
    unsafe {
        std::ptr::addr_of_mut!((*c).status).write(wc_status(one[0].status));
        std::ptr::addr_of_mut!((*c).wr_id).write(one[0].wr_id);
    }
    0
}

/// `ibv_start_poll`: the first completion, or ENOENT (then no `ibv_end_poll` is due). Until
/// `ibv_end_poll` the batch is this thread's: another poller's `ibv_start_poll` waits, as it
/// does for the CQ lock a provider holds.
unsafe extern "C" fn start_poll(c: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: a readable attribute or null.
    if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: a live CQ (no reference to it is held while `advance` writes its fields).
    unsafe { cq_ex(c) }.poller.enter();
    // SAFETY: a live CQ.
    let r = unsafe { advance(c) };
    if r != 0 {
        // SAFETY: a live CQ.
        unsafe { cq_ex(c) }.poller.leave();
    }
    r
}

/// `ibv_next_poll`: the next completion, or ENOENT.
unsafe extern "C" fn next_poll(c: *mut ibv_cq_ex) -> c_int {
    // SAFETY: a live CQ.
    unsafe { advance(c) }
}

/// `ibv_end_poll`: the completions read are already retired from the ring; the batch ends.
unsafe extern "C" fn end_poll(c: *mut ibv_cq_ex) {
    // SAFETY: a live CQ.
    unsafe { cq_ex(c) }.poller.leave();
}

/// The current completion, converted as `ibv_poll_cq` gives it.
///
/// # Safety
/// `c` is a live CQ.
unsafe fn current(c: *mut ibv_cq_ex) -> ibv_wc {
    // SAFETY: as the caller promises.
    c_wc(&unsafe { cq_ex(c) }.current.lock().unwrap_or_else(|e| e.into_inner()).0)
}

unsafe extern "C" fn read_opcode(c: *mut ibv_cq_ex) -> c_int {
    // SAFETY: a live CQ.
    unsafe { current(c) }.opcode
}
unsafe extern "C" fn read_vendor_err(c: *mut ibv_cq_ex) -> u32 {
    // SAFETY: a live CQ.
    unsafe { current(c) }.vendor_err
}
unsafe extern "C" fn read_byte_len(c: *mut ibv_cq_ex) -> u32 {
    // SAFETY: a live CQ.
    unsafe { current(c) }.byte_len
}
/// The immediate data (network order) or, with `IBV_WC_WITH_INV`, the invalidated R_Key.
unsafe extern "C" fn read_imm_data(c: *mut ibv_cq_ex) -> u32 {
    // SAFETY: a live CQ.
    unsafe { current(c) }.imm_data
}
unsafe extern "C" fn read_qp_num(c: *mut ibv_cq_ex) -> u32 {
    // SAFETY: a live CQ.
    unsafe { current(c) }.qp_num
}
unsafe extern "C" fn read_src_qp(c: *mut ibv_cq_ex) -> u32 {
    // SAFETY: a live CQ.
    unsafe { current(c) }.src_qp
}
unsafe extern "C" fn read_wc_flags(c: *mut ibv_cq_ex) -> c_uint {
    // SAFETY: a live CQ.
    unsafe { current(c) }.wc_flags
}
unsafe extern "C" fn read_slid(c: *mut ibv_cq_ex) -> u32 {
    // SAFETY: a live CQ.
    u32::from(unsafe { current(c) }.slid)
}
unsafe extern "C" fn read_sl(c: *mut ibv_cq_ex) -> u8 {
    // SAFETY: a live CQ.
    unsafe { current(c) }.sl
}
unsafe extern "C" fn read_dlid_path_bits(c: *mut ibv_cq_ex) -> u8 {
    // SAFETY: a live CQ.
    unsafe { current(c) }.dlid_path_bits
}
/// When the program took the completion from the ring (CLOCK_MONOTONIC nanoseconds, the
/// `hca_core_clock` of 1 GHz that Query Device Ex reports): softhca's CQEs carry no time of
/// their own, so this is the moment the completion was polled, not when it was written.
unsafe extern "C" fn read_completion_ts(c: *mut ibv_cq_ex) -> u64 {
    // SAFETY: a live CQ.
    unsafe { cq_ex(c) }.current.lock().unwrap_or_else(|e| e.into_inner()).1
}
/// The same moment in wall-clock time (CLOCK_REALTIME nanoseconds).
unsafe extern "C" fn read_completion_wallclock_ns(c: *mut ibv_cq_ex) -> u64 {
    // SAFETY: a live CQ.
    unsafe { cq_ex(c) }.current.lock().unwrap_or_else(|e| e.into_inner()).2
}
