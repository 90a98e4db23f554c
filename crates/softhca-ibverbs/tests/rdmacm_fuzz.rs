//! A seeded, bounded fuzz harness of the drop-in's rdma_cm C ABI (`softhca_rdma_*`, what
//! `librdmacm.so.1` forwards to), in process: random calls in random order with random
//! arguments, as a careless program makes them: ids in the wrong state for the call, NULL
//! where librdmacm checks for it, addresses of every kind (this device's, another local one,
//! one of no host, the any address, an unknown family), ports taken twice, connection
//! parameters out of range, oversized private data, unknown options, events taken and
//! acknowledged, requests accepted or rejected or left, ids migrated and destroyed while
//! connections are under way. Each call must return 0 or -1 with an errno librdmacm gives;
//! nothing may crash, abort or hang (a watchdog turns a hang into a failure). At the end every
//! id and channel is destroyed.
//!
//! Ids are asynchronous (on non-blocking channels): a synchronous id waits for its events, so
//! a fuzzed one could wait out the CM's timeouts. Every event taken is acknowledged at once
//! (`rdma_destroy_id` waits for the acknowledgement of the events it handed out, as
//! librdmacm's does). `SOFTHCA_FUZZ_SEED` and `SOFTHCA_FUZZ_ITERS` change the run.

use std::ffi::{c_int, CString};
use std::ptr::null_mut;

#[path = "common/fuzz.rs"]
mod fuzz;
use fuzz::{errno, run_params, Rng, Watchdog};

use softhca_ibverbs::abi::*;
use softhca_ibverbs::rdmacm::abi::*;

#[path = "common/rdmacm_ffi.rs"]
mod rdmacm_ffi;
use rdmacm_ffi::*;

const ADDR: [u8; 4] = [127, 0, 0, 177];
const DEFAULT_SEED: u64 = 0x5EED_C0DE_0001;
const DEFAULT_ITERS: u64 = 2000;

/// The errnos librdmacm's calls give (and the kernel's rdma_cm through them).
const ALLOWED: &[c_int] = &[
    libc::EINVAL,
    libc::ENODEV,
    libc::EADDRINUSE,
    libc::EADDRNOTAVAIL,
    libc::EAFNOSUPPORT,
    libc::ENOSYS,
    libc::EOPNOTSUPP,
    libc::EAGAIN,
    libc::ENOMEM,
    libc::ECONNREFUSED,
    libc::ETIMEDOUT,
    libc::EBUSY,
    libc::EISCONN,
];

/// A call's result: 0, or -1 with an allowed errno.
fn check(what: &str, rc: c_int) -> bool {
    assert!(rc == 0 || (rc == -1 && ALLOWED.contains(&errno())), "{what}: {rc}, errno {}", errno());
    rc == 0
}

struct Fuzz {
    rng: Rng,
    channels: Vec<*mut rdma_event_channel>,
    ids: Vec<*mut rdma_cm_id>,
    ops: u64,
    /// Events taken, by type: the run must reach connections, not only error paths.
    events: [u64; 16],
}

impl Fuzz {
    fn id(&mut self) -> *mut rdma_cm_id {
        if self.rng.below(20) == 0 {
            null_mut()
        } else {
            self.rng.pick(&self.ids).unwrap_or(null_mut())
        }
    }

    fn addr(&mut self) -> libc::sockaddr_in {
        let port = match self.rng.below(4) {
            0 => 0,
            1 => 7000,
            _ => 7000 + self.rng.below(4) as u16,
        };
        let ip = match self.rng.below(6) {
            0 => [0, 0, 0, 0],
            1 => [127, 0, 0, 178], // loopback, not the device's: bound with no device
            2 => [203, 0, 113, 9], // TEST-NET-3: no host's
            _ => ADDR,
        };
        sin(ip, port)
    }

    /// Takes and acknowledges every waiting event; keeps the ids of connection requests.
    fn drain(&mut self) {
        for ch in self.channels.clone() {
            loop {
                let mut ev = null_mut();
                // SAFETY: a live channel of this run; a local out pointer.
                if unsafe { softhca_rdma_get_cm_event(ch, &mut ev) } != 0 {
                    assert_eq!(errno(), libc::EAGAIN, "get_cm_event on a non-blocking channel");
                    break;
                }
                // SAFETY: the event just taken.
                let e = unsafe { &*ev };
                assert!((0..16).contains(&e.event), "event type {}", e.event);
                self.events[e.event as usize] += 1;
                let request = (e.event == RDMA_CM_EVENT_CONNECT_REQUEST).then_some(e.id);
                // SAFETY: the event just taken, acknowledged once.
                assert_eq!(unsafe { softhca_rdma_ack_cm_event(ev) }, 0);
                if let Some(id) = request {
                    if !self.ids.contains(&id) {
                        self.ids.push(id);
                    }
                    // The program's answer, now or never: accept (with a QP), reject, or leave it.
                    // SAFETY: the request's live id.
                    unsafe {
                        match self.rng.below(4) {
                            0 | 1 => {
                                let mut attr = rc_init();
                                softhca_rdma_create_qp(id, null_mut(), &mut attr);
                                check("accept", softhca_rdma_accept(id, null_mut()));
                            }
                            2 => {
                                check("reject", softhca_rdma_reject(id, std::ptr::null(), 0));
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }

    /// After a call whose event the CM thread queues (a REQ's CONNECT_REQUEST, a REP's
    /// ESTABLISHED, a REJ): waits until a channel has an event (at most 50 ms, a guard: they
    /// come in microseconds, and a call that fails queues none), then takes them all.
    fn settle(&mut self) {
        let mut fds: Vec<libc::pollfd> =
            // SAFETY: live channels of this run.
            self.channels.iter().map(|&c| libc::pollfd { fd: unsafe { (*c).fd }, events: libc::POLLIN, revents: 0 }).collect();
        // SAFETY: a local array of pollfds.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
        self.drain();
    }

    /// A connection attempt the random walk alone rarely assembles: a listener on one of the
    /// fuzzed ports and a client that resolves, makes its QP and connects to it; the random
    /// steps then accept, reject, disconnect or destroy either end.
    fn scenario(&mut self) {
        if self.channels.is_empty() || self.ids.len() > 20 {
            return;
        }
        let port = 7000 + self.rng.below(4) as u16;
        let (lch, cch) = (self.rng.pick(&self.channels).unwrap(), self.rng.pick(&self.channels).unwrap());
        // SAFETY: live channels; local out pointers and addresses.
        unsafe {
            let (mut l, mut c) = (null_mut(), null_mut());
            assert_eq!(softhca_rdma_create_id(lch, &mut l, null_mut(), RDMA_PS_TCP), 0);
            assert_eq!(softhca_rdma_create_id(cch, &mut c, null_mut(), RDMA_PS_TCP), 0);
            self.ids.push(l);
            self.ids.push(c);
            let mut a = sin(ADDR, port);
            if check("bind_addr", softhca_rdma_bind_addr(l, &mut a as *mut _ as *mut libc::sockaddr)) {
                check("listen", softhca_rdma_listen(l, 4));
            }
            // Address and route resolution queue their events before they return.
            check(
                "resolve_addr",
                softhca_rdma_resolve_addr(c, null_mut(), &mut a as *mut _ as *mut libc::sockaddr, 100),
            );
            self.drain();
            check("resolve_route", softhca_rdma_resolve_route(c, 100));
            self.drain();
            let mut attr = rc_init();
            softhca_rdma_create_qp(c, null_mut(), &mut attr);
            if check("connect", softhca_rdma_connect(c, null_mut())) {
                self.settle();
            }
        }
    }

    fn step(&mut self) {
        self.ops += 1;
        let op = self.rng.below(24);
        // SAFETY (every call below): the pointers are live objects of this run, locals, or
        // NULL where librdmacm checks for it.
        unsafe {
            match op {
                0 if self.channels.len() < 4 => {
                    let ch = softhca_rdma_create_event_channel();
                    assert!(!ch.is_null());
                    let fl = libc::fcntl((*ch).fd, libc::F_GETFL);
                    libc::fcntl((*ch).fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
                    self.channels.push(ch);
                }
                1 | 2 if self.ids.len() < 24 && !self.channels.is_empty() => {
                    let ch = self.rng.pick(&self.channels).unwrap();
                    let ps = *[RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IB, RDMA_PS_IPOIB, 0x99]
                        .get(self.rng.below(5) as usize)
                        .unwrap();
                    let mut id = null_mut();
                    let rc = softhca_rdma_create_id(ch, &mut id, null_mut(), ps);
                    check("create_id", rc);
                    if rc == 0 {
                        self.ids.push(id);
                    }
                }
                3 => {
                    let id = self.id();
                    let mut a = self.addr();
                    if self.rng.below(10) == 0 {
                        a.sin_family = 77; // an unknown family
                    }
                    let p = if self.rng.below(10) == 0 { null_mut() } else { &mut a as *mut _ as *mut libc::sockaddr };
                    check("bind_addr", softhca_rdma_bind_addr(id, p));
                }
                4 | 5 => {
                    let id = self.id();
                    let mut dst = sin(
                        if self.rng.below(3) == 0 { [127, 0, 0, 99] } else { ADDR },
                        7000 + self.rng.below(4) as u16,
                    );
                    let p =
                        if self.rng.below(10) == 0 { null_mut() } else { &mut dst as *mut _ as *mut libc::sockaddr };
                    check("resolve_addr", softhca_rdma_resolve_addr(id, null_mut(), p, 100));
                }
                6 => {
                    let id = self.id();
                    check("resolve_route", softhca_rdma_resolve_route(id, 100));
                }
                7 => {
                    let id = self.id();
                    let backlog = self.rng.below(8) as c_int;
                    check("listen", softhca_rdma_listen(id, backlog));
                }
                8 => {
                    let id = self.id();
                    let mut attr: ibv_qp_init_attr = std::mem::zeroed();
                    attr.qp_type = *[IBV_QPT_RC, IBV_QPT_UD, IBV_QPT_UC].get(self.rng.below(3) as usize).unwrap();
                    attr.cap.max_send_wr = self.rng.below(64) as u32;
                    attr.cap.max_recv_wr = self.rng.below(64) as u32;
                    attr.cap.max_send_sge = 1;
                    attr.cap.max_recv_sge = 1;
                    let rc = softhca_rdma_create_qp(id, null_mut(), &mut attr);
                    // A QP's creation answers with libibverbs' errnos too.
                    assert!(rc == 0 || errno() != 0, "create_qp: {rc}");
                }
                9 => {
                    let id = self.id();
                    if !id.is_null() {
                        softhca_rdma_destroy_qp(id);
                    }
                }
                10 | 11 => {
                    let id = self.id();
                    let data = [0xABu8; 255];
                    let mut p = rdma_conn_param {
                        private_data: if self.rng.below(4) == 0 { std::ptr::null() } else { data.as_ptr().cast() },
                        private_data_len: self.rng.below(256) as u8,
                        responder_resources: self.rng.below(256) as u8,
                        initiator_depth: self.rng.below(256) as u8,
                        flow_control: self.rng.below(2) as u8,
                        retry_count: self.rng.below(9) as u8,
                        rnr_retry_count: self.rng.below(9) as u8,
                        srq: 0,
                        qp_num: self.rng.next() as u32,
                    };
                    let pp = if self.rng.below(4) == 0 { null_mut() } else { &mut p as *mut rdma_conn_param };
                    if op == 10 {
                        check("connect", softhca_rdma_connect(id, pp));
                    } else {
                        check("accept", softhca_rdma_accept(id, pp));
                    }
                }
                12 => {
                    let id = self.id();
                    let data = [1u8; 255];
                    let len = self.rng.below(256) as u8;
                    check("reject", softhca_rdma_reject(id, data.as_ptr().cast(), len));
                }
                13 => {
                    let id = self.id();
                    check("disconnect", softhca_rdma_disconnect(id));
                }
                14 => {
                    let id = self.id();
                    check("establish", softhca_rdma_establish(id));
                    let (other, event) = (self.id(), self.rng.below(10) as c_int);
                    check("notify", softhca_rdma_notify(other, event));
                }
                15 => {
                    let id = self.id();
                    let mut a: ibv_qp_attr = std::mem::zeroed();
                    a.qp_state = self.rng.below(8) as c_int;
                    let mut mask = 0;
                    check("init_qp_attr", softhca_rdma_init_qp_attr(id, &mut a, &mut mask));
                }
                16 => {
                    let id = self.id();
                    let mut v = [self.rng.next() as u8; 8];
                    let len = *[1usize, 4, 8, 0].get(self.rng.below(4) as usize).unwrap();
                    let rc = softhca_rdma_set_option(
                        id,
                        self.rng.below(3) as c_int,
                        self.rng.below(5) as c_int,
                        v.as_mut_ptr().cast(),
                        len,
                    );
                    check("set_option", rc);
                }
                17 => {
                    let id = self.id();
                    let ch = self.rng.pick(&self.channels).unwrap_or(null_mut());
                    if !id.is_null() && !ch.is_null() {
                        check("migrate_id", softhca_rdma_migrate_id(id, ch));
                    }
                    softhca_rdma_get_src_port(self.id());
                    let mut a = self.addr();
                    let id = self.id();
                    let sa = &mut a as *mut _ as *mut libc::sockaddr;
                    // A UD id with a device and an IPv4 address joins (the group need not be
                    // multicast: the attach then fails in the event); anything else is refused.
                    match softhca_rdma_join_multicast(id, sa, null_mut()) {
                        0 => assert_eq!(softhca_rdma_leave_multicast(id, sa), 0, "leave what was joined"),
                        rc => assert_eq!(rc, -1),
                    }
                }
                18 => {
                    let nodes = ["127.0.0.177", "not an address", "::1", "0.0.0.0"];
                    let node = CString::new(nodes[self.rng.below(4) as usize]).unwrap();
                    let service = CString::new(format!("{}", self.rng.below(70000))).unwrap();
                    let mut hints: rdma_addrinfo = std::mem::zeroed();
                    hints.ai_flags = (self.rng.below(4)) as c_int;
                    hints.ai_port_space = *[0, RDMA_PS_TCP, RDMA_PS_UDP].get(self.rng.below(3) as usize).unwrap();
                    let mut res = null_mut();
                    let h = if self.rng.below(3) == 0 { std::ptr::null() } else { &hints as *const rdma_addrinfo };
                    let rc = softhca_rdma_getaddrinfo(node.as_ptr(), service.as_ptr(), h, &mut res);
                    if rc == 0 {
                        softhca_rdma_freeaddrinfo(res);
                    }
                }
                19 | 20 => {
                    if let Some(i) = (!self.ids.is_empty()).then(|| self.rng.below(self.ids.len() as u64) as usize) {
                        let id = self.ids.swap_remove(i);
                        if !(*id).qp.is_null() {
                            softhca_rdma_destroy_qp(id);
                        }
                        assert_eq!(softhca_rdma_destroy_id(id), 0, "destroy_id");
                    }
                }
                21 => self.scenario(),
                22 => {
                    // Accept a request (any id: most are not requests, and say so).
                    let id = self.id();
                    if !id.is_null() && (*id).qp.is_null() && (*id).verbs.is_null().then_some(()).is_none() {
                        let mut attr = rc_init();
                        softhca_rdma_create_qp(id, null_mut(), &mut attr);
                    }
                    if check("accept", softhca_rdma_accept(id, null_mut())) {
                        self.settle();
                    }
                }
                _ => {}
            }
        }
        self.drain();
    }
}

#[test]
fn rdma_cm_c_abi_under_random_calls() {
    // The process's device on an address of its own (the CM binds it at first use).
    std::env::set_var("SOFTHCA_ADDR", "127.0.0.177");
    let (seed, iters) = run_params(DEFAULT_SEED, DEFAULT_ITERS);
    let watchdog = Watchdog::start("rdmacm_fuzz", seed);
    let mut f = Fuzz { rng: Rng(seed), channels: Vec::new(), ids: Vec::new(), ops: 0, events: [0; 16] };
    for _ in 0..iters {
        f.step();
    }
    // Everything destroyed, in a valid order: the ids (after their QPs), then the channels.
    f.drain();
    for id in std::mem::take(&mut f.ids) {
        // SAFETY: live ids of this run.
        unsafe {
            if !(*id).qp.is_null() {
                softhca_rdma_destroy_qp(id);
            }
            assert_eq!(softhca_rdma_destroy_id(id), 0);
        }
    }
    for ch in std::mem::take(&mut f.channels) {
        // SAFETY: live channels of this run, their ids gone.
        unsafe { softhca_rdma_destroy_event_channel(ch) };
    }
    drop(watchdog);
    eprintln!("rdmacm_fuzz: {} operations, seed {seed:#x}, events by type {:?}", f.ops, f.events);
    // The run reached every step of a connection: requests, establishment, rejections.
    assert!(f.events[RDMA_CM_EVENT_ADDR_RESOLVED as usize] > 0 && f.events[RDMA_CM_EVENT_ROUTE_RESOLVED as usize] > 0);
    assert!(f.events[RDMA_CM_EVENT_CONNECT_REQUEST as usize] > 0, "{:?}", f.events);
    assert!(f.events[RDMA_CM_EVENT_ESTABLISHED as usize] > 0, "{:?}", f.events);
    assert!(f.events[RDMA_CM_EVENT_REJECTED as usize] > 0, "{:?}", f.events);
}
