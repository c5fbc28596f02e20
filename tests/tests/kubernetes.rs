//! `deploy/kubernetes/` against what gradwire actually reads. There is no
//! Kubernetes cluster here to apply the manifests to, so this checks
//! everything short of that:
//!
//! - every file is YAML of the expected kinds;
//! - every variable a pod is given is one gradwire reads (the launch
//!   contract's names, torchrun's, the communicator's settings), and those
//!   a rank needs are all there, the token from a Secret;
//! - the Job's rank count, the Service and rank 0's address agree;
//! - each pod's environment, read by gradwire's own launch-contract parser,
//!   gives its rank, the world size and rank 0's store;
//! - the Job's command runs as local processes with exactly the pods'
//!   environments (rank 0's DNS name replaced by 127.0.0.1) and passes its
//!   own result checks;
//! - the job server's and agents' command lines, with Kubernetes' `$(VAR)`
//!   substitutions made, pass gwjob's own argument parser, and point at
//!   each other.

use gw_rendezvous::launch_env::{LaunchEnv, var};
use gw_tests::{bin, collect};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use yaml_rust2::{Yaml, YamlLoader};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kubernetes")
        .canonicalize()
        .expect("deploy/kubernetes")
}

fn load(file: &str) -> Vec<Yaml> {
    let path = dir().join(file);
    let text = std::fs::read_to_string(&path).expect("read the manifest");
    YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn s(y: &Yaml) -> &str {
    y.as_str().unwrap_or("")
}

/// The document of `kind`; panics naming the file if there is not exactly one.
fn one<'a>(docs: &'a [Yaml], kind: &str, file: &str) -> &'a Yaml {
    let v: Vec<&Yaml> = docs.iter().filter(|d| s(&d["kind"]) == kind).collect();
    assert_eq!(v.len(), 1, "{file}: one {kind}");
    v[0]
}

/// How a container's variable gets its value.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    Text(String),
    Field(String),
    Secret { name: String, key: String },
}

fn env_of(container: &Yaml) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for e in container["env"].as_vec().map(Vec::as_slice).unwrap_or(&[]) {
        let name = s(&e["name"]).to_string();
        let v = if let Some(t) = e["value"].as_str() {
            Value::Text(t.to_string())
        } else if let Some(f) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Value::Field(f.to_string())
        } else {
            let r = &e["valueFrom"]["secretKeyRef"];
            assert!(!r.is_badvalue(), "{name}: no value, field or secret");
            Value::Secret {
                name: s(&r["name"]).to_string(),
                key: s(&r["key"]).to_string(),
            }
        };
        out.push((name, v));
    }
    out
}

/// Every variable name gradwire reads from a rank's environment.
fn known_names() -> Vec<String> {
    let mut v: Vec<String> = var::RESERVED.iter().map(|s| s.to_string()).collect();
    v.extend(var::torchrun::ALL.iter().map(|s| s.to_string()));
    // The communicator's settings, as it lists them itself.
    for line in gw_collectives::Config::default().describe() {
        if let Some(name) = line.split_whitespace().next() {
            v.push(name.to_string());
        }
    }
    v.push("GW_DEBUG".into());
    v
}

/// The Job's single container and the names the test needs.
struct JobSpec {
    job: String,
    service: String,
    world: u32,
    env: Vec<(String, Value)>,
    command: Vec<String>,
}

fn job_spec() -> JobSpec {
    let docs = load("job.yaml");
    let svc = one(&docs, "Service", "job.yaml");
    let job = one(&docs, "Job", "job.yaml");
    let spec = &job["spec"];
    assert_eq!(
        s(&spec["completionMode"]),
        "Indexed",
        "rank = completion index"
    );
    let completions = spec["completions"].as_i64().expect("completions");
    assert_eq!(
        spec["parallelism"].as_i64(),
        Some(completions),
        "every rank must run at once"
    );
    assert_eq!(
        s(&svc["spec"]["clusterIP"]),
        "None",
        "the Service must be headless (one DNS name per pod)"
    );
    let pod = &spec["template"];
    let labels = pod["metadata"]["labels"].as_hash().expect("pod labels");
    for (k, v) in svc["spec"]["selector"].as_hash().expect("selector") {
        assert_eq!(labels.get(k), Some(v), "the Service selects the pods");
    }
    let service = s(&svc["metadata"]["name"]).to_string();
    assert_eq!(
        s(&pod["spec"]["subdomain"]),
        service,
        "pods get DNS names under the Service only with subdomain set to it"
    );
    let containers = pod["spec"]["containers"].as_vec().expect("containers");
    assert_eq!(containers.len(), 1, "one rank per pod");
    let c = &containers[0];
    let command: Vec<String> = c["command"]
        .as_vec()
        .expect("command")
        .iter()
        .map(|a| s(a).to_string())
        .collect();
    JobSpec {
        job: s(&job["metadata"]["name"]).to_string(),
        service,
        world: u32::try_from(completions).expect("a rank count"),
        env: env_of(c),
        command,
    }
}

/// A pod's environment: the completion index as its rank, the Secret's
/// token, and `master` for rank 0's address.
fn pod_env(j: &JobSpec, index: u32, token: &str, master: Option<&str>) -> HashMap<String, String> {
    j.env
        .iter()
        .map(|(k, v)| {
            let value = match v {
                Value::Text(t) if k == var::torchrun::MASTER_ADDR => {
                    master.map_or_else(|| t.clone(), str::to_string)
                }
                Value::Text(t) => t.clone(),
                Value::Field(f) => {
                    assert_eq!(
                        f, "metadata.annotations['batch.kubernetes.io/job-completion-index']",
                        "{k}: only the completion index may come from the pod"
                    );
                    index.to_string()
                }
                Value::Secret { .. } => token.to_string(),
            };
            (k.clone(), value)
        })
        .collect()
}

#[test]
fn the_job_sets_what_ranks_read_and_nothing_else() {
    let j = job_spec();
    let known = known_names();
    for (name, _) in &j.env {
        assert!(
            known.contains(name),
            "job.yaml sets {name}, which gradwire does not read"
        );
    }
    let value = |k: &str| j.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    for k in [
        var::torchrun::RANK,
        var::torchrun::WORLD_SIZE,
        var::torchrun::MASTER_ADDR,
        var::torchrun::MASTER_PORT,
        var::TOKEN,
    ] {
        assert!(value(k).is_some(), "job.yaml does not set {k}");
    }
    assert!(
        matches!(value(var::TOKEN), Some(Value::Secret { .. })),
        "the job token must come from a Secret"
    );
    assert_eq!(
        value(var::torchrun::WORLD_SIZE),
        Some(Value::Text(j.world.to_string())),
        "WORLD_SIZE must be the Job's completions"
    );
    assert_eq!(
        value(var::torchrun::MASTER_ADDR),
        Some(Value::Text(format!("{}-0.{}", j.job, j.service))),
        "rank 0 is the pod <job>-0 under the Service"
    );
    // What each rank makes of its pod's environment, through the parser
    // every rank runs.
    let token = "0123456789abcdef0123456789abcdef";
    for i in 0..j.world {
        let env = pod_env(&j, i, token, None);
        let le = LaunchEnv::from_lookup(&|k| env.get(k).cloned())
            .unwrap_or_else(|e| panic!("pod {i}: {e}"));
        assert_eq!((le.rank, le.world), (i, j.world), "pod {i}");
        assert_eq!((le.local_rank, le.local_size), (0, 1), "pod {i}");
        let port = match value(var::torchrun::MASTER_PORT) {
            Some(Value::Text(p)) => p,
            other => panic!("MASTER_PORT is {other:?}"),
        };
        assert_eq!(le.store, format!("{}-0.{}:{port}", j.job, j.service));
        assert!(le.host_store, "rank 0 hosts the store");
        assert_eq!(le.token, token);
    }
}

#[test]
fn the_jobs_command_runs_with_the_pods_environments() {
    let j = job_spec();
    let token = gw_rendezvous::token::random_hex(16).expect("a token");
    let exe = bin(&j.command[0]);
    let children: Vec<_> = (0..j.world)
        .map(|i| {
            let env = pod_env(&j, i, &token, Some("127.0.0.1"));
            Command::new(&exe)
                .args(&j.command[1..])
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .envs(&env)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let runs: Vec<_> = children
        .into_iter()
        .enumerate()
        .map(|(i, c)| collect(c, Duration::from_secs(240), &format!("pod {i}")))
        .collect();
    for (i, r) in runs.iter().enumerate() {
        assert!(r.status.success(), "pod {i}: {}", r.all());
    }
    assert!(
        runs[0].stdout.contains("# Out of bounds values : 0 OK"),
        "rank 0's check:\n{}",
        runs[0].all()
    );
}

/// `command` + `args` of a container with `$(VAR)` replaced from `vars`,
/// as Kubernetes does.
fn argv(c: &Yaml, vars: &HashMap<&str, String>) -> Vec<String> {
    let words = c["command"]
        .as_vec()
        .into_iter()
        .chain(c["args"].as_vec())
        .flatten();
    words
        .map(|w| {
            let mut w = s(w).to_string();
            while let Some(a) = w.find("$(") {
                let b = a + w[a..].find(')').expect("a closed $(");
                let name = &w[a + 2..b];
                let v = vars
                    .get(name)
                    .unwrap_or_else(|| panic!("$({name}) is not a variable of the container"));
                w.replace_range(a..=b, v);
            }
            w
        })
        .collect()
}

fn flag<'a>(args: &'a [String], name: &str) -> &'a str {
    let i = args
        .iter()
        .position(|a| a == name)
        .unwrap_or_else(|| panic!("no {name} in {args:?}"));
    &args[i + 1]
}

#[test]
fn the_server_and_agents_command_lines_parse_and_meet() {
    use gw_jobserver::cli::command::{Gwjob, parse};
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("k8s-agents");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let admin = "0123456789abcdef0123456789abcdef".to_string();

    // The server.
    let docs = load("jobserver.yaml");
    let svc = one(&docs, "Service", "jobserver.yaml");
    let set = one(&docs, "StatefulSet", "jobserver.yaml");
    let c = &set["spec"]["template"]["spec"]["containers"][0];
    let env = env_of(c);
    assert!(
        env.iter()
            .any(|(k, v)| k == "GW_ADMIN_TOKEN" && matches!(v, Value::Secret { .. })),
        "the admin token comes from a Secret"
    );
    let server = argv(c, &HashMap::new());
    assert_eq!(server[0], "gwjob");
    match parse(server[1..].iter().map(Into::into), Some(admin.clone())) {
        Ok(Gwjob::Serve(_)) => {}
        other => panic!("gwjob {:?}: {other:?}", &server[1..]),
    }
    let listen_port = flag(&server, "--listen")
        .rsplit_once(':')
        .map(|(_, p)| p.to_string())
        .expect("--listen HOST:PORT");
    let port = &svc["spec"]["ports"][0];
    assert_eq!(
        port["targetPort"].as_i64().map(|p| p.to_string()),
        Some(listen_port),
        "the Service reaches the port the server listens on"
    );
    let url = format!(
        "http://{}:{}",
        s(&svc["metadata"]["name"]),
        port["port"].as_i64().expect("port")
    );
    assert_eq!(flag(&server, "--advertise"), url);

    // The agents, as the node "node-a" would run one.
    let docs = load("agents.yaml");
    let ds = one(&docs, "DaemonSet", "agents.yaml");
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let mut vars: HashMap<&str, String> = HashMap::new();
    for (k, v) in env_of(c) {
        let value = match v {
            Value::Text(t) => t,
            Value::Field(f) if f == "spec.nodeName" => "node-a".into(),
            Value::Field(f) if f == "status.podIP" => "10.1.2.3".into(),
            other => panic!("agents.yaml: {k} from {other:?}"),
        };
        vars.insert(Box::leak(k.into_boxed_str()), value);
    }
    let agent = argv(c, &vars);
    assert_eq!(
        flag(&agent, "--server"),
        url,
        "agents reach the server's Service"
    );
    assert_eq!(flag(&agent, "--node"), "node-a");
    // The node's token, where the Secret volume puts it.
    let mount = c["volumeMounts"][0]["mountPath"]
        .as_str()
        .expect("the tokens' mount");
    let token_file = flag(&agent, "--token-file");
    assert_eq!(
        Path::new(token_file).parent(),
        Some(Path::new(mount)),
        "the token file is in the mounted Secret"
    );
    assert_eq!(
        s(&pod["volumes"][0]["secret"]["secretName"]),
        "gwjob-node-tokens"
    );
    let local = tmp.join("node-a");
    std::fs::write(&local, "node-a-token-0123456789\n").expect("token file");
    let agent: Vec<String> = agent
        .iter()
        .map(|a| {
            if a == token_file {
                local.display().to_string()
            } else {
                a.clone()
            }
        })
        .collect();
    match parse(agent[1..].iter().map(Into::into), None) {
        Ok(Gwjob::Agent(_)) => {}
        other => panic!("gwjob {:?}: {other:?}", &agent[1..]),
    }
}
