//! Debian's perftest and python3-pyverbs, which name `libmlx5.so.1` and `libefa.so.1` in
//! `DT_NEEDED` and are linked BIND_NOW, load on the drop-in `libibverbs.so.1` with these two
//! beside it (all three linked as `scripts/build-libibverbs` links them), and pyverbs gets
//! from them the answers rdma-core gives for a device that is not an mlx5 or EFA one. Needs
//! `cc`, perftest and python3-pyverbs; without them each test says so and passes, except
//! under CI (`CI` set), where they are required.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Runs `cmd` with `LD_LIBRARY_PATH` at the three libraries, for at most 60 s (a hang
/// guard); returns its exit status and its stdout and stderr together.
fn run(cmd: &mut Command) -> (std::process::ExitStatus, String) {
    let mut child =
        cmd.env("LD_LIBRARY_PATH", all_libs()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{cmd:?} did not finish in 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut text = String::new();
    child.stdout.take().unwrap().read_to_string(&mut text).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut text).unwrap();
    (status, text)
}

const PYTHON: &str = "/usr/bin/python3";

fn pyverbs() -> bool {
    tool("cc")
        && have(
            Path::new(PYTHON).exists() && Path::new("/usr/lib/python3/dist-packages/pyverbs").exists(),
            "/usr/bin/python3 with pyverbs (python3-pyverbs)",
        )
}

#[test]
fn ib_write_bw_loads_and_prints_its_usage() {
    if !(tool("cc") && have(Path::new("/usr/bin/ib_write_bw").exists(), "ib_write_bw (perftest)")) {
        return;
    }
    let (_, text) = run(Command::new("/usr/bin/ib_write_bw").arg("--help"));
    assert!(!text.contains("symbol lookup error") && !text.contains("error while loading"), "{text}");
    assert!(text.contains("Usage:") && text.contains("ib_write_bw <host>"), "{text}");
    // And the loader took all three from the directory, not the system's.
    let (_, ldd) = run(Command::new("ldd").arg("/usr/bin/ib_write_bw"));
    for lib in ["libibverbs.so.1", "libmlx5.so.1", "libefa.so.1"] {
        let ours = format!("{lib} => {}", all_libs().join(lib).display());
        assert!(ldd.contains(&ours), "{lib} is not ours:\n{ldd}");
    }
}

#[test]
fn pyverbs_imports_its_mlx5_and_efa_modules() {
    if !pyverbs() {
        return;
    }
    let script = "import re, pyverbs.providers.mlx5.mlx5dv, pyverbs.providers.efa.efadv\n\
                  maps = open('/proc/self/maps').read()\n\
                  print(sorted(set(re.findall(r'\\S*lib(?:mlx5|efa|ibverbs)\\.so\\.1', maps))))\n";
    let (status, text) = run(Command::new(PYTHON).args(["-c", script]));
    assert!(status.success(), "{text}");
    for lib in ["libibverbs.so.1", "libmlx5.so.1", "libefa.so.1"] {
        assert!(text.contains(&all_libs().join(lib).display().to_string()), "{lib} is not ours: {text}");
    }
}

/// pyverbs on the softhca device: its mlx5 context refuses the device (`mlx5dv_is_supported`
/// is false), the EFA query fails with `EOPNOTSUPP`, and a software-steering domain, a root
/// table and a drop action are created, as with rdma-core on any Ethernet device that is not
/// an mlx5 one, while a level-1 table and a matcher fail with `EOPNOTSUPP`.
#[test]
fn pyverbs_gets_rdma_cores_answers_for_the_softhca_device() {
    if !pyverbs() {
        return;
    }
    let script = r#"
import pyverbs.device as d
from pyverbs.providers.mlx5.mlx5dv import Mlx5Context, Mlx5DVContextAttr
from pyverbs.providers.efa.efadv import EfaContext
from pyverbs.providers.mlx5.dr_domain import DrDomain
from pyverbs.providers.mlx5.dr_table import DrTable
from pyverbs.providers.mlx5.dr_action import DrActionDrop
from pyverbs.providers.mlx5.dr_matcher import DrMatcher
from pyverbs.providers.mlx5.mlx5dv_flow import Mlx5FlowMatchParameters
name = d.get_device_list()[0].name.decode()
try:
    Mlx5Context(Mlx5DVContextAttr(), name=name)
except Exception as e:
    print('mlx5 context:', e)
efa = EfaContext(name=name)
try:
    efa.query_efa_device()
except Exception as e:
    print('efa query:', e)
efa.close()
ctx = d.Context(name=name)
dmn = DrDomain(ctx, 0)
tbl = DrTable(dmn, 0)
drop = DrActionDrop()
print('domain, root table, drop action: created')
try:
    DrTable(dmn, 1)
except Exception as e:
    print('level 1 table:', e)
try:
    DrMatcher(tbl, 0, 0, Mlx5FlowMatchParameters(64, bytes(64)))
except Exception as e:
    print('matcher:', e)
drop.close(); tbl.close(); dmn.close(); ctx.close()
print('closed')
"#;
    let (status, text) = run(Command::new(PYTHON).args(["-c", script]));
    assert!(status.success(), "{text}");
    for line in [
        "mlx5 context: This is not an MLX5 device",
        "efa query: Failed to query efa device",
        "Errno: 95, Operation not supported",
        "domain, root table, drop action: created",
        "level 1 table: DrTable creation failed.. Errno: 95",
        "matcher: DrMatcher creation failed.. Errno: 95",
        "closed",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
}
