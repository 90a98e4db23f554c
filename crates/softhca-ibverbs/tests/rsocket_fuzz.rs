//! A seeded, bounded fuzz harness of the drop-in's rsocket C ABI (`softhca_rs_*`, what
//! `librdmacm.so.1`'s `r*` functions forward to), in process: random calls in random order
//! with random arguments, as a careless program makes them: numbers that are no rsocket,
//! sockets in the wrong state for the call, binds of taken ports, connects to ports nobody
//! listens on, sends and receives of every size with every flag, options of every level with
//! short and odd values, mappings and writes at offsets nobody mapped, shutdowns and closes
//! midway, NULL where the program may pass it. Each call must return what librdmacm's does
//! (a count or 0, else -1 with an errno it gives); nothing may crash, abort or hang (a
//! watchdog turns a hang into a failure).
//!
//! Every socket is non-blocking (`SOCK_NONBLOCK`, and `F_SETFL` keeps `O_NONBLOCK`): a
//! blocking call would wait for a peer the harness may never drive. `rshutdown` and `rclose`
//! still wait for their sends, which the device itself completes. `SOFTHCA_FUZZ_SEED` and
//! `SOFTHCA_FUZZ_ITERS` change the run.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

#[path = "common/fuzz.rs"]
mod fuzz;
use fuzz::{errno, run_params, Rng, Watchdog};

// The library whose exported functions the declarations below name.
use softhca_ibverbs as _;

#[path = "common/rsocket_ffi.rs"]
mod rsocket_ffi;
use rsocket_ffi::*;

const ADDR: [u8; 4] = [127, 0, 0, 178];
const PORTS: [u16; 3] = [7790, 7791, 7792];
const DEFAULT_SEED: u64 = 0x5EED_50C4_0001;
const DEFAULT_ITERS: u64 = 3000;
const SOL_RDMA: c_int = 0x10000;

/// The errnos librdmacm's rsocket calls give.
const ALLOWED: &[c_int] = &[
    libc::EBADF,
    libc::EINVAL,
    libc::EAGAIN,
    libc::EINPROGRESS,
    libc::ENOTCONN,
    libc::ECONNREFUSED,
    libc::ECONNRESET,
    libc::EISCONN,
    libc::ENOTSUP,
    libc::ENOSYS,
    libc::EADDRINUSE,
    libc::EADDRNOTAVAIL,
    libc::ENODEV,
    libc::ENOMEM,
    libc::EFAULT,
    libc::ETIMEDOUT,
    libc::EIO,
    libc::ECONNABORTED,
    libc::EAFNOSUPPORT,
];

/// A call's result: non-negative, or -1 with an allowed errno.
fn check(what: &str, rc: i64) -> bool {
    if rc < 0 && std::env::var_os("RS_FUZZ_DEBUG").is_some() {
        eprintln!("{what}: errno {}", errno());
    }
    assert!(rc >= 0 || (rc == -1 && ALLOWED.contains(&errno())), "{what}: {rc}, errno {}", errno());
    rc >= 0
}

fn sin(port: u16) -> libc::sockaddr_in {
    // SAFETY: an all-zero sockaddr_in is valid.
    let mut a: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    a.sin_family = libc::AF_INET as libc::sa_family_t;
    a.sin_port = port.to_be();
    a.sin_addr.s_addr = u32::from_be_bytes(ADDR).to_be();
    a
}

struct Fuzz {
    rng: Rng,
    /// Open rsockets.
    socks: Vec<c_int>,
    buf: Vec<u8>,
    /// Mapped regions (riomap), by socket: address and length.
    maps: Vec<(c_int, usize, usize)>,
    accepted: u64,
    received: u64,
    scenarios: u64,
}

impl Fuzz {
    fn sock(&mut self) -> c_int {
        // Now and then a number that is no rsocket.
        if self.rng.below(20) == 0 || self.socks.is_empty() {
            return self.rng.pick(&[-1, 0, 2, 999_999]).unwrap_or(-1);
        }
        self.rng.pick(&self.socks).unwrap_or(-1)
    }

    fn size(&mut self) -> usize {
        match self.rng.below(4) {
            0 => 0,
            1 => self.rng.below(100) as usize,
            2 => self.rng.below(70_000) as usize,
            _ => self.rng.below(self.buf.len() as u64) as usize,
        }
    }

    fn flags(&mut self) -> c_int {
        self.rng
            .pick(&[0, libc::MSG_DONTWAIT, libc::MSG_PEEK, libc::MSG_WAITALL, libc::MSG_PEEK | libc::MSG_WAITALL])
            .unwrap_or(0)
    }

    /// A connection the random walk alone rarely assembles: a listener on a port of its own,
    /// a client that connects to it, and the accept, waited for with rpoll (bounded); the
    /// random steps then use, shut down or close any of the three.
    fn scenario(&mut self) {
        let port = 7800 + (self.scenarios % 64) as u16;
        self.scenarios += 1;
        let a = sin(port);
        let alen = std::mem::size_of_val(&a) as libc::socklen_t;
        // SAFETY: local addresses and pollfds; the sockets are this run's.
        unsafe {
            let l = softhca_rs_socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
            let c = softhca_rs_socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
            assert!(l >= 0 && c >= 0, "rsocket: errno {}", errno());
            self.socks.extend([l, c]);
            let listening = check("rbind", softhca_rs_bind(l, (&a as *const libc::sockaddr_in).cast(), alen).into())
                && check("rlisten", softhca_rs_listen(l, 4).into());
            let r = softhca_rs_connect(c, (&a as *const libc::sockaddr_in).cast(), alen);
            if !listening || !check("rconnect", r.into()) && errno() != libc::EINPROGRESS {
                return;
            }
            for _ in 0..200 {
                let mut p = [libc::pollfd { fd: l, events: libc::POLLIN, revents: 0 }];
                check("rpoll", softhca_rs_poll(p.as_mut_ptr(), 1, 10).into());
                let s = softhca_rs_accept(l, null_mut(), null_mut());
                if check("raccept", s.into()) {
                    self.accepted += 1;
                    self.socks.push(s);
                    return;
                }
            }
        }
    }

    fn step(&mut self) {
        // At most 24 sockets open (each may hold buffers of up to 32 MiB).
        while self.socks.len() > 24 {
            let fd = self.socks.remove(0);
            self.maps.retain(|&(s, ..)| s != fd);
            // SAFETY: an open rsocket of this run.
            assert_eq!(unsafe { softhca_rs_close(fd) }, 0);
        }
        if self.rng.below(40) == 0 {
            return self.scenario();
        }
        let fd = self.sock();
        let buf = self.buf.as_mut_ptr();
        let op = self.rng.below(18);
        // SAFETY (of every call below): the harness's buffers and structures, alive for the
        // call and of the lengths passed; numbers that are no rsocket are the point.
        unsafe {
            match op {
                0 => {
                    let (domain, ty) = match self.rng.below(8) {
                        0 => (libc::AF_UNIX, libc::SOCK_STREAM),
                        1 => (libc::AF_INET, libc::SOCK_DGRAM),
                        2 => (libc::AF_INET, libc::SOCK_RAW),
                        _ => (libc::AF_INET, libc::SOCK_STREAM),
                    };
                    let s = softhca_rs_socket(domain, ty | libc::SOCK_NONBLOCK, 0);
                    if check("rsocket", s.into()) {
                        self.socks.push(s);
                    }
                }
                1 => {
                    let a = sin(self.rng.pick(&PORTS).unwrap_or(0) * (self.rng.below(3).min(1) as u16));
                    let len = if self.rng.below(6) == 0 { 4 } else { std::mem::size_of_val(&a) as libc::socklen_t };
                    check("rbind", softhca_rs_bind(fd, (&a as *const libc::sockaddr_in).cast(), len).into());
                }
                2 => {
                    check("rlisten", softhca_rs_listen(fd, self.rng.below(8) as c_int - 1).into());
                }
                3 => {
                    let a = sin(self.rng.pick(&PORTS).unwrap_or(1) + (self.rng.below(4) == 0) as u16 * 100);
                    let r = softhca_rs_connect(
                        fd,
                        (&a as *const libc::sockaddr_in).cast(),
                        std::mem::size_of_val(&a) as u32,
                    );
                    check("rconnect", r.into());
                }
                4 => {
                    // SAFETY: an all-zero sockaddr_storage is valid.
                    let mut a: libc::sockaddr_storage = std::mem::zeroed();
                    let mut len = self.rng.below(129) as libc::socklen_t;
                    let (ap, lp) = if self.rng.below(2) == 0 {
                        ((&mut a as *mut libc::sockaddr_storage).cast(), &mut len as *mut _)
                    } else {
                        (null_mut(), null_mut())
                    };
                    let s = softhca_rs_accept(fd, ap, lp);
                    if check("raccept", s.into()) {
                        self.accepted += 1;
                        self.socks.push(s);
                    }
                }
                5 => {
                    let n = self.size();
                    check("rsend", softhca_rs_send(fd, buf.cast(), n, self.flags() & !libc::MSG_PEEK) as i64);
                }
                6 => {
                    let n = self.size();
                    let r = softhca_rs_recv(fd, buf.cast(), n, self.flags());
                    if check("rrecv", r as i64) {
                        self.received += r as u64;
                    }
                }
                7 => {
                    let a = self.size() / 3;
                    let iov = [
                        libc::iovec { iov_base: buf.cast(), iov_len: a },
                        libc::iovec { iov_base: null_mut(), iov_len: 0 },
                        libc::iovec { iov_base: buf.add(a).cast(), iov_len: a },
                    ];
                    let mut iov = iov;
                    if self.rng.below(8) == 0 {
                        // Lengths that add up past SSIZE_MAX (or wrap): EINVAL, as writev's.
                        iov[0].iov_len = usize::MAX / 2 + 1;
                        iov[2].iov_len = usize::MAX / 2 + 1;
                    }
                    let n = self.rng.below(4) as c_int;
                    check("rsendv", softhca_rs_sendv(fd, iov.as_ptr(), n, libc::MSG_DONTWAIT) as i64);
                }
                8 => {
                    let mut iov = libc::iovec { iov_base: buf.cast(), iov_len: self.size() };
                    // SAFETY: an all-zero msghdr is valid.
                    let mut m: libc::msghdr = std::mem::zeroed();
                    m.msg_iov = &mut iov;
                    m.msg_iovlen = 1;
                    if self.rng.below(5) == 0 {
                        m.msg_control = buf.cast();
                        m.msg_controllen = 8;
                    }
                    let mp = if self.rng.below(8) == 0 { null_mut() } else { &mut m as *mut libc::msghdr };
                    check("rrecvmsg", softhca_rs_recvmsg(fd, mp, 0) as i64);
                }
                9 => {
                    // Every open socket and a stray number or two; now and then with a few
                    // milliseconds' timeout, in which connections progress (the service
                    // thread accepts, the CM completes) as a program's waits let them.
                    let mut fds: Vec<libc::pollfd> = self
                        .socks
                        .clone()
                        .into_iter()
                        .chain([self.sock(), -1])
                        .map(|fd| libc::pollfd { fd, events: libc::POLLIN | libc::POLLOUT, revents: 0 })
                        .collect();
                    let timeout = self.rng.pick(&[0, 0, 5]).unwrap_or(0);
                    check("rpoll", softhca_rs_poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout).into());
                }
                10 => {
                    let how = self.rng.below(4) as c_int;
                    check("rshutdown", softhca_rs_shutdown(fd, how).into());
                }
                11 => {
                    if self.rng.below(3) == 0 {
                        let r = softhca_rs_close(fd);
                        // librdmacm 44 answers EBADF itself for a number that is no rsocket.
                        assert!(r == 0 || r == libc::EBADF, "rclose: {r}");
                        if r == 0 {
                            self.socks.retain(|&s| s != fd);
                            self.maps.retain(|&(s, ..)| s != fd);
                        }
                    }
                }
                12 => {
                    let (level, name) = self
                        .rng
                        .pick(&[
                            (libc::SOL_SOCKET, libc::SO_REUSEADDR),
                            (libc::SOL_SOCKET, libc::SO_RCVBUF),
                            (libc::SOL_SOCKET, libc::SO_SNDBUF),
                            (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
                            (libc::SOL_SOCKET, libc::SO_LINGER),
                            (libc::SOL_SOCKET, libc::SO_PRIORITY),
                            (libc::IPPROTO_TCP, libc::TCP_NODELAY),
                            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
                            (libc::IPPROTO_TCP, libc::TCP_MAXSEG),
                            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY),
                            (libc::IPPROTO_IP, libc::IP_TOS),
                            (SOL_RDMA, 0),
                            (SOL_RDMA, 1),
                            (SOL_RDMA, 2),
                            (SOL_RDMA, 3),
                            (SOL_RDMA, 9),
                        ])
                        .unwrap_or((0, 0));
                    // Values up to 16 MiB for the sizes (a buffer of that much is made).
                    let v: c_int = self.rng.pick(&[0, 1, 2, 64, 4096, 1 << 20, 1 << 23, -1]).unwrap_or(0);
                    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
                    let (p, len): (*const c_void, u32) = match (level, name) {
                        (libc::SOL_SOCKET, libc::SO_LINGER) => ((&linger as *const libc::linger).cast(), 8),
                        _ if self.rng.below(10) == 0 => (null_mut(), 4),
                        _ => ((&v as *const c_int).cast(), 4),
                    };
                    check("rsetsockopt", softhca_rs_setsockopt(fd, level, name, p, len).into());
                    let mut out = [0u8; 256];
                    let mut olen = 256u32;
                    let r = softhca_rs_getsockopt(fd, level, name, out.as_mut_ptr().cast(), &mut olen);
                    check("rgetsockopt", r.into());
                }
                13 => {
                    let cmd = self
                        .rng
                        .pick(&[libc::F_GETFL, libc::F_SETFL, libc::F_GETFD, libc::F_SETFD, libc::F_DUPFD])
                        .unwrap_or(0);
                    // F_SETFL keeps the socket non-blocking (see the module docs).
                    let arg = if cmd == libc::F_SETFL { libc::O_NONBLOCK | libc::O_APPEND } else { libc::FD_CLOEXEC };
                    check("rfcntl", softhca_rs_fcntl(fd, cmd, arg).into());
                }
                14 => {
                    let len = 4096 * (1 + self.rng.below(4) as usize);
                    let at = 4096 * self.rng.below(8) as usize;
                    let prot = self.rng.pick(&[libc::PROT_WRITE, libc::PROT_NONE, libc::PROT_READ]).unwrap_or(0);
                    // -4096: a mapping that ends at the top of the 64-bit range.
                    let off = self.rng.pick(&[-1i64, 0, 1 << 20, -4096]).unwrap_or(0);
                    let r = softhca_rs_iomap(fd, buf.add(at).cast(), len, prot, 0, off);
                    // The offset mapped, which may be negative: -1 alone is a failure.
                    if r != -1 || check("riomap", r) {
                        self.maps.push((fd, buf as usize + at, len));
                    }
                }
                15 => {
                    let n = self.size().min(70_000);
                    let off = self.rng.pick(&[0i64, 4096, 1 << 20, -5, -4096, -2048]).unwrap_or(0);
                    let r = softhca_rs_iowrite(fd, buf.cast(), n, off, libc::MSG_DONTWAIT);
                    check("riowrite", r as i64);
                }
                16 => {
                    let (s, a, l) = self.rng.pick(&self.maps).unwrap_or((fd, buf as usize, 4096));
                    if check("riounmap", softhca_rs_iounmap(s, a as *mut c_void, l).into()) {
                        if let Some(k) = self.maps.iter().position(|&m| m == (s, a, l)) {
                            self.maps.remove(k);
                        }
                    }
                }
                _ => {
                    let mut a = [0u8; 128];
                    let mut len = self.rng.below(129) as libc::socklen_t;
                    check("rgetpeername", softhca_rs_getpeername(fd, a.as_mut_ptr().cast(), &mut len).into());
                }
            }
        }
    }
}

#[test]
fn rsocket_c_abi_under_random_calls() {
    std::env::set_var("SOFTHCA_ADDR", "127.0.0.178");
    let (seed, iters) = run_params(DEFAULT_SEED, DEFAULT_ITERS);
    let watchdog = Watchdog::start("rsocket_fuzz", seed);
    let mut f = Fuzz {
        rng: Rng(seed),
        socks: Vec::new(),
        buf: vec![0x5a; 256 * 1024],
        maps: Vec::new(),
        accepted: 0,
        received: 0,
        scenarios: 0,
    };
    for _ in 0..iters {
        f.step();
    }
    for s in std::mem::take(&mut f.socks) {
        // SAFETY: the run's open rsockets.
        assert_eq!(unsafe { softhca_rs_close(s) }, 0);
    }
    drop(watchdog);
    eprintln!("rsocket_fuzz: seed {seed:#x}, {} accepted, {} bytes received", f.accepted, f.received);
    assert!(f.accepted > 0 && f.received > 0, "the run reached no connection or no data");
}
