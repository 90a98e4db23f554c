//! Roles for multi-process UDP tests. A test binary re-runs itself as a child with
//! `SOFTHCA_UDP_ROLE=serve|client` and `--exact <role test> --ignored`; the parent relays one
//! `INFO <ip> <qpn> <va> <rkey>` line each way.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};

use softhca::link::udp::UdpConfig;
use softhca::*;

use super::*;

pub const MR_LEN: usize = 1 << 20;

pub fn info(e: &End, mr: &Mr) -> String {
    format!("INFO {} {} {} {}", e.dev.addr(), e.qp.qp_num(), mr.addr(), mr.rkey())
}

/// Connects `e` to the peer of an INFO line; returns the peer's (VA, R_Key).
pub fn connect_info(e: &End, line: &str) -> (u64, u32) {
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f.first(), Some(&"INFO"), "bad peer line {line:?}");
    let gid = match f[1].parse::<std::net::IpAddr>().unwrap() {
        std::net::IpAddr::V4(a) => Gid::from_ipv4(a),
        std::net::IpAddr::V6(a) => Gid::from_ipv6(a),
    };
    connect(&e.qp, gid, f[2].parse().unwrap(), Mtu::Mtu4096);
    (f[3].parse().unwrap(), f[4].parse().unwrap())
}

fn all() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

/// Server: prints INFO, reads the client's, receives one 100 000-byte Send and echoes it.
pub fn serve() {
    let e = end(UdpConfig::default());
    let mr = e.pd.alloc_mr(MR_LEN, all()).unwrap();
    println!("{}", info(&e, &mr));
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    connect_info(&e, &line);
    e.qp.post_recv(&[RecvWr::new(1, &[mr.sge(0..100_000)])]).unwrap();
    let w = wait(&e.cq, 1, 20);
    assert_eq!((w[0].status, w[0].byte_len), (WcStatus::Success, 100_000), "{w:?}");
    e.qp.post_send(&[SendWr::send(2, &[mr.sge(0..100_000)]).signaled()]).unwrap();
    assert_eq!(wait(&e.cq, 1, 20)[0].status, WcStatus::Success);
    println!("SERVED {:?}", e.dev.counters());
}

/// Client: connects to `SOFTHCA_UDP_PEER`, prints INFO, writes and reads the server's MR,
/// runs a fetch-and-add, then sends 100 000 bytes and checks the echo.
pub fn client() {
    let peer = std::env::var("SOFTHCA_UDP_PEER").expect("SOFTHCA_UDP_PEER");
    let e = end(UdpConfig::default());
    let mr = e.pd.reg_mr((0..MR_LEN).map(|i| (i * 13 % 251) as u8).collect(), all()).unwrap();
    let back = e.pd.alloc_mr(MR_LEN, all()).unwrap();
    let (va, rkey) = connect_info(&e, &peer);
    println!("{}", info(&e, &mr));
    std::io::stdout().flush().unwrap();
    let off = 500_000u64;
    e.qp.post_send(&[SendWr::rdma_write(1, &[mr.sge(0..65536)], va + off, rkey).signaled()]).unwrap();
    assert_eq!(wait(&e.cq, 1, 20)[0].status, WcStatus::Success);
    e.qp.post_send(&[SendWr::rdma_read(2, &[back.sge(0..65536)], va + off, rkey).signaled()]).unwrap();
    assert_eq!(wait(&e.cq, 1, 20)[0].status, WcStatus::Success);
    assert_eq!(back.to_vec().unwrap()[..65536], mr.to_vec().unwrap()[..65536]);
    e.qp.post_send(&[SendWr::atomic_fetch_add(3, &[back.sge(0..8)], va + 8, rkey, 5).signaled()]).unwrap();
    assert_eq!(wait(&e.cq, 1, 20)[0].status, WcStatus::Success);
    e.qp.post_recv(&[RecvWr::new(9, &[back.sge(0..100_000)])]).unwrap();
    e.qp.post_send(&[SendWr::send(4, &[mr.sge(0..100_000)]).signaled()]).unwrap();
    let w = wait(&e.cq, 2, 20);
    assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
    assert_eq!(back.to_vec().unwrap()[..100_000], mr.to_vec().unwrap()[..100_000]);
    println!("CLIENT OK {:?}", e.dev.counters());
}

/// Runs this test binary as `role` (the ignored test `test_name`), optionally under a prefix
/// command (e.g. `ip netns exec NS`) and with extra environment.
pub fn spawn(prefix: &[&str], test_name: &str, role: &str, env: &[(&str, &str)]) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match prefix.split_first() {
        Some((p, rest)) => {
            let mut c = Command::new(p);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.args(["--exact", test_name, "--ignored", "--nocapture", "--test-threads=1"]);
    cmd.env("SOFTHCA_UDP_ROLE", role).envs(env.iter().copied());
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("spawn child")
}

/// Reads lines until one contains `prefix`; returns the line from there; panics at end of output.
pub fn read_until(out: &mut impl BufRead, prefix: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child ended before printing {prefix}");
        // The test harness prints "test udp_role ... " without a newline before the output.
        if let Some(at) = line.find(prefix) {
            return line[at..].trim().to_string();
        }
    }
}

/// The whole exchange between a server and a client child.
pub fn run_pair(
    server_prefix: &[&str],
    client_prefix: &[&str],
    test_name: &str,
    senv: &[(&str, &str)],
    cenv: &[(&str, &str)],
) {
    let mut s = spawn(server_prefix, test_name, "serve", senv);
    let mut sout = BufReader::new(s.stdout.take().unwrap());
    let sinfo = read_until(&mut sout, "INFO");
    let mut env = cenv.to_vec();
    env.push(("SOFTHCA_UDP_PEER", &sinfo));
    let mut c = spawn(client_prefix, test_name, "client", &env);
    let mut cout = BufReader::new(c.stdout.take().unwrap());
    let cinfo = read_until(&mut cout, "INFO");
    let mut sin = s.stdin.take().unwrap();
    writeln!(sin, "{cinfo}").unwrap();
    sin.flush().unwrap();
    let ok = read_until(&mut cout, "CLIENT OK");
    let served = read_until(&mut sout, "SERVED");
    eprintln!("server {sinfo}\nclient {cinfo}\n{ok}\n{served}");
    assert!(c.wait().unwrap().success(), "client failed");
    assert!(s.wait().unwrap().success(), "server failed");
}

/// The body of the role test: runs the role named by `SOFTHCA_UDP_ROLE`, if any.
pub fn role() {
    match std::env::var("SOFTHCA_UDP_ROLE").as_deref() {
        Ok("serve") => serve(),
        Ok("client") => client(),
        _ => {}
    }
}
