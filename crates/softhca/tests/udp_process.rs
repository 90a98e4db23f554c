//! Two processes on one machine: the test re-runs its own binary as a server and a client,
//! each with its own UdpDevice on the next free 127.0.0.x, and relays their QP information
//! over stdin/stdout; the client runs RDMA Write, Read, Fetch&Add and a Send echoed back.

mod udp_common;

use udp_common::procs;

/// A child role (run by the other tests, does nothing when run directly).
#[test]
#[ignore]
fn udp_role() {
    procs::role();
}

#[test]
fn two_processes_rc() {
    procs::run_pair(&[], &[], "udp_role", &[], &[]);
}
