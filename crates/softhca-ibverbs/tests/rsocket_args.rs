//! Arguments of the drop-in's rsocket C ABI (`softhca_rs_*`, what `librdmacm.so.1`'s `r*`
//! functions forward to) at the ends of their ranges, each answered as the kernel answers
//! the socket call it stands for. Release builds check integer overflow, and a panic across
//! the C boundary aborts the program: each of these aborted it before.

use std::ffi::c_int;

#[path = "common/rsocket_ffi.rs"]
mod rsocket_ffi;
use rsocket_ffi::*;

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `rselect` with the longest timeout a `timeval` holds waits as long as poll can (here not
/// at all: a pipe's write end is ready), and with a negative one fails with EINVAL, as
/// select(2) does. The longest one overflowed its conversion to milliseconds.
#[test]
fn rselect_takes_any_timeout_select_takes() {
    let mut p = [0 as c_int; 2];
    // SAFETY: a two-int array for pipe(2).
    assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
    let select = |tv_sec: libc::time_t, tv_usec: libc::suseconds_t| {
        // SAFETY: a zeroed fd_set is an empty one; FD_SET on a descriptor below FD_SETSIZE.
        let mut w: libc::fd_set = unsafe { std::mem::zeroed() };
        unsafe { libc::FD_SET(p[1], &mut w) };
        let mut tv = libc::timeval { tv_sec, tv_usec };
        // SAFETY: live sets and timeval.
        let n = unsafe { softhca_rs_select(p[1] + 1, std::ptr::null_mut(), &mut w, std::ptr::null_mut(), &mut tv) };
        (n, if n < 0 { errno() } else { 0 })
    };
    assert_eq!(select(libc::time_t::MAX, 999_999), (1, 0));
    assert_eq!(select(-1, 0), (-1, libc::EINVAL));
    assert_eq!(select(0, -1), (-1, libc::EINVAL));
    // SAFETY: the pipe's descriptors, closed once.
    unsafe { (libc::close(p[0]), libc::close(p[1])) };
}

/// `rsendv` with a length that is negative as an `ssize_t` fails with EINVAL, and one whose
/// lengths add up past `SSIZE_MAX` goes on (the sum clipped), as writev(2) does: here to the
/// socket's own answer, not connected. The sum overflowed.
#[test]
fn rsendv_takes_lengths_as_writev_does() {
    // SAFETY: plain socket calls.
    let fd = unsafe { softhca_rs_socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0) };
    assert!(fd >= 0, "rsocket: {}", errno());
    let mut byte = 0u8;
    let half = libc::iovec { iov_base: (&mut byte as *mut u8).cast(), iov_len: usize::MAX / 2 + 1 };
    // SAFETY: two iovecs; their lengths are refused before any byte is read.
    let r = unsafe { softhca_rs_sendv(fd, [half, half].as_ptr(), 2, libc::MSG_DONTWAIT) };
    assert_eq!((r, errno()), (-1, libc::EINVAL));
    // SAFETY: one byte from a live local; the socket is not connected.
    let plain = unsafe { softhca_rs_send(fd, (&byte as *const u8).cast(), 1, libc::MSG_DONTWAIT) };
    let plain = (plain, errno());
    assert_ne!(plain.1, libc::EINVAL);
    let most = libc::iovec { iov_len: isize::MAX as usize, ..half };
    // SAFETY: three iovecs; the socket is not connected, so no byte is read.
    let r = unsafe { softhca_rs_sendv(fd, [most, most, most].as_ptr(), 3, libc::MSG_DONTWAIT) };
    assert_eq!((r as isize, errno()), (plain.0, plain.1), "the sum is clipped, not refused: as a plain send");
    // SAFETY: the socket, closed once.
    assert_eq!(unsafe { softhca_rs_close(fd) }, 0);
}

/// `riowrite` into a mapping whose offset the peer put at the top of the 64-bit range
/// (`riomap(..., -4096)`: any offset but -1 is the program's to choose) lands where it
/// should; the offset plus the length, summed to find the mapping, overflowed.
#[test]
fn riowrite_reaches_a_mapping_at_the_top_of_the_offsets() {
    // A hang guard: a side that failed would leave the other waiting for ever.
    std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_secs(120));
        eprintln!("riowrite_reaches_a_mapping_at_the_top_of_the_offsets: hung");
        std::process::abort();
    });
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let port = 7796;
    // Room for one mapping each way (SOL_RDMA, RDMA_IOMAPSIZE), set before the connection.
    let iomaps = |fd: c_int| {
        let one: c_int = 1;
        // SAFETY: an int option from a live local.
        let r = unsafe { softhca_rs_setsockopt(fd, 0x10000, 3, (&one as *const c_int).cast(), 4) };
        assert_eq!(r, 0, "RDMA_IOMAPSIZE: {}", errno());
    };
    // SAFETY: socket calls on live locals.
    let l = unsafe { softhca_rs_socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    assert!(l >= 0, "rsocket: {}", errno());
    iomaps(l);
    let a = localhost(port);
    assert_eq!(unsafe { softhca_rs_bind(l, (&a as *const libc::sockaddr_in).cast(), len) }, 0, "{}", errno());
    assert_eq!(unsafe { softhca_rs_listen(l, 1) }, 0);
    let server = std::thread::spawn(move || {
        // SAFETY: as above; the mapped buffer outlives the mapping (the socket closes first).
        unsafe {
            let s = softhca_rs_accept(l, std::ptr::null_mut(), std::ptr::null_mut());
            assert!(s >= 0, "raccept: {}", errno());
            let mut region = vec![0u8; 4096];
            let at = softhca_rs_iomap(s, region.as_mut_ptr().cast(), 4096, libc::PROT_WRITE, 0, -4096);
            assert_eq!(at, -4096, "riomap: {}", errno());
            // The mapping reaches the peer with this message.
            assert_eq!(softhca_rs_send(s, b"m".as_ptr().cast(), 1, 0), 1);
            let mut done = [0u8; 1];
            assert_eq!(softhca_rs_recv(s, done.as_mut_ptr().cast(), 1, 0), 1, "{}", errno());
            assert_eq!(softhca_rs_close(s), 0);
            assert_eq!(softhca_rs_close(l), 0);
            region
        }
    });
    // SAFETY: as above.
    unsafe {
        let c = softhca_rs_socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        iomaps(c);
        assert_eq!(softhca_rs_connect(c, (&a as *const libc::sockaddr_in).cast(), len), 0, "{}", errno());
        let mut m = [0u8; 1];
        assert_eq!(softhca_rs_recv(c, m.as_mut_ptr().cast(), 1, 0), 1, "{}", errno());
        let data: Vec<u8> = (0..64u8).collect();
        assert_eq!(softhca_rs_iowrite(c, data.as_ptr().cast(), 64, -4096 + 100, 0), 64, "{}", errno());
        // After the write: the peer reads its region once this arrives.
        assert_eq!(softhca_rs_send(c, b"d".as_ptr().cast(), 1, 0), 1);
        let region = server.join().unwrap();
        assert_eq!(&region[100..164], &data[..]);
        assert!(region[..100].iter().chain(&region[164..]).all(|&b| b == 0));
        assert_eq!(softhca_rs_close(c), 0);
    }
}
