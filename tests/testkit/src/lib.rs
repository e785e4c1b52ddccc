//! Test support for throttlegate: real `redis-server` processes on free
//! loopback ports, stopped (and their files removed) when dropped.
//!
//! `redis-server` is found on `PATH`, or at `$THROTTLEGATE_REDIS_SERVER`.
#![deny(missing_docs)]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1 (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

fn redis_server_bin() -> String {
    std::env::var("THROTTLEGATE_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// A `redis-server` started for one test.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    /// The server binary (`redis-server` or another, e.g. Valkey's).
    bin: String,
}

impl RedisServer {
    /// Start a server with no persistence on a free port.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Start a server with extra `--option value` arguments.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::start_bin(&redis_server_bin(), extra)
    }

    /// Start the server binary `bin` (a Redis-compatible server) with extra arguments.
    pub fn start_bin(bin: &str, extra: &[&str]) -> RedisServer {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("throttlegate-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut s = RedisServer {
            child: None,
            port,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            bin: bin.to_string(),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--enable-debug-command")
            .arg("local")
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd
            .spawn()
            .expect("cannot start redis-server: install it (make test does) or set THROTTLEGATE_REDIS_SERVER");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.command(&["PING"]).map(|r| r == "+PONG").unwrap_or(false) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Stop the server (SIGKILL), keeping its port for [`RedisServer::restart`].
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start the server again on the same port (empty, no persistence).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Send `SIGSTOP` (`true`) or `SIGCONT` (`false`) to the server.
    pub fn pause(&self, paused: bool) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .arg(if paused { "-STOP" } else { "-CONT" })
                .arg(c.id().to_string())
                .status();
        }
    }

    /// Run one command and return the raw first reply line (`+OK`, `:3`,
    /// `$5` followed by the bulk, joined with `\n`, ...). Arrays are returned
    /// as their element lines joined with `\n`, nested one level.
    pub fn command(&self, args: &[&str]) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
        }
        stream.write_all(req.as_bytes())?;
        let mut reader = BufReader::new(stream);
        read_reply(&mut reader)
    }

    /// `INFO commandstats` calls for `command` (lowercase, e.g. `"evalsha"`).
    pub fn command_calls(&self, command: &str) -> u64 {
        let info = self.command(&["INFO", "commandstats"]).unwrap_or_default();
        let needle = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&needle))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

fn read_line(r: &mut impl BufRead) -> std::io::Result<String> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    Ok(line.trim_end_matches("\r\n").to_string())
}

fn read_reply(r: &mut impl BufRead) -> std::io::Result<String> {
    let line = read_line(r)?;
    match line.chars().next() {
        Some('$') => {
            let n: i64 = line[1..].parse().unwrap_or(-1);
            if n < 0 {
                return Ok("(nil)".into());
            }
            let mut buf = vec![0u8; n as usize + 2];
            std::io::Read::read_exact(r, &mut buf)?;
            buf.truncate(n as usize);
            Ok(String::from_utf8_lossy(&buf).into_owned())
        }
        Some('*') => {
            let n: i64 = line[1..].parse().unwrap_or(-1);
            let mut items = Vec::new();
            for _ in 0..n.max(0) {
                items.push(read_reply(r)?);
            }
            Ok(items.join("\n"))
        }
        Some(':') => Ok(line[1..].to_string()),
        _ => Ok(line),
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A paused server would ignore SIGKILL until continued on some systems.
            let _ = Command::new("kill").arg("-CONT").arg(c.id().to_string()).status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A local Redis Cluster: `primaries` primaries with one replica each, made
/// with `redis-cli --cluster create` on free loopback ports and torn down
/// when dropped.
pub struct RedisCluster {
    /// Every node, primaries first (as given to `--cluster create`).
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Start `primaries` primaries and as many replicas, and wait until the
    /// cluster is `ok` on every node.
    pub fn start(primaries: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..primaries * 2)
            .map(|_| {
                // An explicit bus port: the default (port + 10000) does not
                // exist for ports above 55535, which free_port() may return.
                let bus = free_port().to_string();
                RedisServer::start_with(&[
                    "--cluster-port",
                    &bus,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-replica-validity-factor",
                    "0",
                    "--repl-diskless-sync-delay",
                    "0",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        let status = Command::new(std::env::var("THROTTLEGATE_REDIS_CLI").unwrap_or_else(|_| "redis-cli".into()))
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("cannot run redis-cli (Debian package redis-tools)");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = RedisCluster { nodes };
        cluster.wait_ok(Duration::from_secs(20));
        // Wait for every replica's initial sync, so failover tests start
        // from replicas that follow their primaries.
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let synced = cluster.nodes.iter().all(|n| {
                n.command(&["INFO", "replication"])
                    .map(|i| i.contains("role:slave") == i.contains("master_link_status:up"))
                    .unwrap_or(false)
            });
            if synced {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    /// Wait until every running node says `cluster_state:ok` and knows all slots.
    pub fn wait_ok(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let ok = self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                n.command(&["CLUSTER", "INFO"])
                    .map(|i| i.contains("cluster_state:ok") && i.contains("cluster_slots_ok:16384"))
                    .unwrap_or(false)
            });
            if ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the cluster did not become ok within {limit:?}");
    }

    /// `redis+cluster://` URL with every primary as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// The node currently serving `slot` as a primary.
    pub fn primary_of(&self, slot: u16) -> &RedisServer {
        for n in &self.nodes {
            if n.child.is_none() {
                continue;
            }
            let Ok(nodes) = n.command(&["CLUSTER", "NODES"]) else { continue };
            for line in nodes.lines() {
                let parts: Vec<&str> = line.split_whitespace().collect();
                if parts.len() < 9 || !parts[2].contains("master") || parts[2].contains("fail") {
                    continue;
                }
                let port: u16 = parts[1]
                    .split('@')
                    .next()
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0);
                for range in &parts[8..] {
                    if range.starts_with('[') {
                        continue;
                    }
                    let (lo, hi) = match range.split_once('-') {
                        Some((a, b)) => (a.parse().unwrap_or(1), b.parse().unwrap_or(0)),
                        None => {
                            let v = range.parse().unwrap_or(u16::MAX);
                            (v, v)
                        }
                    };
                    if (lo..=hi).contains(&slot) {
                        if let Some(node) = self.nodes.iter().find(|x| x.port() == port) {
                            return node;
                        }
                    }
                }
            }
            break;
        }
        panic!("no primary serves slot {slot}");
    }

    /// The node id (`CLUSTER MYID`) of `node`.
    pub fn node_id(node: &RedisServer) -> String {
        node.command(&["CLUSTER", "MYID"]).unwrap_or_default()
    }
}

/// A primary, one replica and three sentinels (quorum 2) monitoring them as
/// service `"tg"`, on free loopback ports, with Debian's `redis-sentinel`
/// (`THROTTLEGATE_REDIS_SENTINEL` overrides it). A primary is found down
/// after 1 s; a failover completes within a few seconds.
pub struct SentinelGroup {
    /// The first primary, then a replica after a failover.
    pub primary: RedisServer,
    /// The replica, the primary after a failover.
    pub replica: RedisServer,
    sentinels: Vec<(u16, Child)>,
    dir: PathBuf,
}

/// The service name the sentinels of a [`SentinelGroup`] monitor.
pub const SENTINEL_SERVICE: &str = "tg";

impl SentinelGroup {
    /// Start the group and wait until the replica is in sync and every
    /// sentinel knows it and the other sentinels.
    pub fn start() -> SentinelGroup {
        // Replicas sync at once (not after the default 5 s delay).
        let primary = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
        let replica_of = primary.port().to_string();
        let replica = RedisServer::start_with(&["--repl-diskless-sync-delay", "0", "--replicaof", "127.0.0.1", &replica_of]);
        let dir = std::env::temp_dir().join(format!(
            "throttlegate-sentinel-{}-{}",
            std::process::id(),
            primary.port()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let bin = std::env::var("THROTTLEGATE_REDIS_SENTINEL")
            .unwrap_or_else(|_| "redis-sentinel".to_string());
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port();
            let conf = dir.join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {} 2\n\
                     sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n\
                     sentinel failover-timeout {SENTINEL_SERVICE} 4000\nsentinel parallel-syncs {SENTINEL_SERVICE} 1\n",
                    dir.display(),
                    primary.port()
                ),
            )
            .expect("sentinel config");
            let child = Command::new(&bin)
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("cannot start redis-sentinel: install Debian's redis-sentinel (make test does) or set THROTTLEGATE_REDIS_SENTINEL");
            sentinels.push((port, child));
        }
        let group = SentinelGroup {
            primary,
            replica,
            sentinels,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let synced = group.primary.command(&["INFO", "replication"]).is_ok_and(|i| i.contains("state=online"));
            let ready = synced && group.sentinels.iter().all(|(port, _)| {
                sentinel_command(*port, &["SENTINEL", "REPLICAS", SENTINEL_SERVICE])
                    .map(|r| r.contains(&group.replica.port().to_string()))
                    .unwrap_or(false)
                    && sentinel_command(*port, &["SENTINEL", "SENTINELS", SENTINEL_SERVICE])
                        .map(|r| r.matches("127.0.0.1").count() >= 2)
                        .unwrap_or(false)
            });
            if ready {
                return group;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not see the replica and each other within 20 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis+sentinel://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>/tg`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{SENTINEL_SERVICE}", hosts.join(","))
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|(p, _)| *p).collect()
    }

    /// Run one command on the first sentinel.
    pub fn sentinel(&self, args: &[&str]) -> std::io::Result<String> {
        sentinel_command(self.sentinels[0].0, args)
    }

    /// The port of the primary the first sentinel names now.
    pub fn primary_port(&self) -> Option<u16> {
        let r = self
            .sentinel(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_SERVICE])
            .ok()?;
        r.lines().nth(1)?.parse().ok()
    }
}

fn sentinel_command(port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
    }
    stream.write_all(req.as_bytes())?;
    let mut reader = BufReader::new(stream);
    read_reply(&mut reader)
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        for (_, c) in &mut self.sentinels {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
