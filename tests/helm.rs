//! The Helm chart (deploy/helm/mirror-maker): `helm lint`, and `helm template` with the
//! default values and with ci/custom-values.yaml, each rendered object parsed and checked.
//! No cluster runs here: the pods' config join (the init container's script) is run on the
//! rendered ConfigMap and Secret, and what it makes is loaded as the mirror loads its configs.
//!
//! helm comes from `./scripts/test` (`go install helm.sh/helm/v3/cmd/helm@v3.22.0` into
//! `$HOME/go/bin`); `HELM_BIN` names another one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use mirror_maker::settings::client::{is_secret_key, ClientProps, Role};
use yaml_rust2::{Yaml, YamlLoader};

const CHART: &str = "deploy/helm/mirror-maker";
const CUSTOM: &str = "deploy/helm/mirror-maker/ci/custom-values.yaml";

/// The one value a release must set: the topics to mirror.
const NAMED: &[&str] = &["--set", "whitelist=orders|payments"];
/// The Dockerfile's user, which the pods must run as.
const UID: i64 = 10001;
/// What the mirror takes to close after the flush (src/main.rs: SHUTDOWN_GRACE).
const CLOSE_MS: u64 = 30_000;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn helm() -> PathBuf {
    let path = std::env::var_os("HELM_BIN")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join("go/bin/helm")));
    match path {
        Some(path) if path.is_file() => path,
        _ => panic!(
            "helm not found ($HELM_BIN, or $HOME/go/bin/helm): run ./scripts/test, which installs \
             it with `go install helm.sh/helm/v3/cmd/helm@v3.22.0` (a few minutes, once)"
        ),
    }
}

/// `helm ARGS` in the repository: (success, stdout, stderr).
fn run_helm(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(helm())
        .args(args)
        .current_dir(repo("."))
        .output()
        .expect("running helm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The rendered objects by kind, of `helm template rel CHART ARGS`.
struct Rendered {
    objects: Vec<Yaml>,
}

impl Rendered {
    fn of(args: &[&str]) -> Rendered {
        let mut all = vec!["template", "rel", CHART, "--namespace", "kafka"];
        all.extend_from_slice(args);
        let (ok, stdout, stderr) = run_helm(&all);
        assert!(ok, "helm {all:?} failed: {stderr}");
        let objects = YamlLoader::load_from_str(&stdout)
            .unwrap_or_else(|e| panic!("helm template's output is not YAML: {e}\n{stdout}"))
            .into_iter()
            .filter(|d| !d.is_null())
            .collect();
        Rendered { objects }
    }

    fn all(&self, kind: &str) -> Vec<&Yaml> {
        self.objects
            .iter()
            .filter(|o| o["kind"].as_str() == Some(kind))
            .collect()
    }

    fn one(&self, kind: &str) -> &Yaml {
        let found = self.all(kind);
        assert_eq!(found.len(), 1, "one {kind} expected, found {}", found.len());
        found[0]
    }

    fn deployment(&self) -> &Yaml {
        self.one("Deployment")
    }

    fn pod(&self) -> &Yaml {
        &self.deployment()["spec"]["template"]
    }

    fn container(&self, name: &str) -> &Yaml {
        let spec = &self.pod()["spec"];
        spec["containers"]
            .as_vec()
            .into_iter()
            .chain(spec["initContainers"].as_vec())
            .flatten()
            .find(|c| c["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no container {name}"))
    }

    fn args(&self) -> Vec<String> {
        strings(&self.container("mirror-maker")["args"])
    }

    fn arg(&self, flag: &str) -> String {
        let args = self.args();
        let at = args
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("no {flag} in {args:?}"));
        args[at + 1].clone()
    }

    /// A ConfigMap's or Secret's entries (`data` or `stringData`), as text.
    fn entries(object: &Yaml) -> BTreeMap<String, String> {
        let data = if object["stringData"].is_badvalue() {
            &object["data"]
        } else {
            &object["stringData"]
        };
        data.as_hash()
            .map(|h| {
                h.iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().unwrap().to_owned(),
                            v.as_str().unwrap().to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The two config files as the pod's mirror reads them: the init container's own script
    /// run with its mount points moved into a temporary folder holding the rendered ConfigMap
    /// and Secret.
    fn joined_configs(&self) -> (tempfile::TempDir, ClientProps, ClientProps) {
        let dir = mirror_test_harness::tempdir();
        let root = dir.path().to_str().unwrap().to_owned();
        let init = self.container("join-config");
        let mounts: BTreeMap<String, String> = init["volumeMounts"]
            .as_vec()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["name"].as_str().unwrap().to_owned(),
                    m["mountPath"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let volumes = self.pod()["spec"]["volumes"].as_vec().unwrap();
        let volume = |name: &str| {
            volumes
                .iter()
                .find(|v| v["name"].as_str() == Some(name))
                .unwrap_or_else(|| panic!("no volume {name}"))
        };
        let configmap = self.one("ConfigMap");
        assert_eq!(
            volume("config")["configMap"]["name"],
            configmap["metadata"]["name"]
        );
        let mut fill = vec![(&mounts["config"], Rendered::entries(configmap))];
        if let Some(secret) = self.all("Secret").first() {
            assert_eq!(
                volume("secrets")["secret"]["secretName"],
                secret["metadata"]["name"]
            );
            fill.push((&mounts["secrets"], Rendered::entries(secret)));
        }
        for (mount, entries) in fill {
            let folder = format!("{root}{mount}");
            std::fs::create_dir_all(&folder).unwrap();
            for (name, text) in entries {
                std::fs::write(format!("{folder}/{name}"), text).unwrap();
            }
        }
        let joined = &mounts["joined"];
        std::fs::create_dir_all(format!("{root}{joined}")).unwrap();
        let command = strings(&init["command"]);
        assert_eq!(command[..2], ["/bin/sh", "-ec"], "{command:?}");
        let mut script = command[2].clone();
        for mount in mounts.values() {
            script = script.replace(mount.as_str(), &format!("{root}{mount}"));
        }
        let status = Command::new("/bin/sh")
            .args(["-ec", &script])
            .status()
            .unwrap();
        assert!(status.success(), "the join script failed: {script}");
        // The mirror reads the files the init container wrote, on the same volume.
        let main_mounts = &self.container("mirror-maker")["volumeMounts"];
        assert!(main_mounts.as_vec().unwrap().iter().any(|m| {
            m["name"].as_str() == Some("joined") && m["mountPath"].as_str() == Some(joined)
        }));
        let load = |role, flag: &str| {
            let path = self.arg(flag);
            assert!(path.starts_with(joined.as_str()), "{flag} {path}");
            ClientProps::load(role, Path::new(&format!("{root}{path}")))
                .unwrap_or_else(|e| panic!("{flag}: {e}"))
        };
        let consumer = load(Role::Consumer, "--consumer.config");
        let producer = load(Role::Producer, "--producer.config");
        (dir, consumer, producer)
    }
}

fn strings(y: &Yaml) -> Vec<String> {
    y.as_vec()
        .map(|v| {
            v.iter()
                .map(|s| match s {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    other => panic!("not a string: {other:?}"),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn map_of(y: &Yaml) -> BTreeMap<String, String> {
    y.as_hash()
        .map(|h| {
            h.iter()
                .map(|(k, v)| {
                    let v = match v {
                        Yaml::String(s) => s.clone(),
                        Yaml::Integer(i) => i.to_string(),
                        Yaml::Boolean(b) => b.to_string(),
                        other => format!("{other:?}"),
                    };
                    (k.as_str().unwrap().to_owned(), v)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The pod spec's points that hold whatever the values: non-root as the Dockerfile's user,
/// hardened containers, probes on the health paths, resources, a grace period above the
/// mirror's flush and close, a PodDisruptionBudget over the pods.
fn assert_hardened_probed_and_budgeted(r: &Rendered) {
    let dockerfile = std::fs::read_to_string(repo("Dockerfile")).unwrap();
    assert!(
        dockerfile
            .lines()
            .any(|l| l.trim() == format!("USER {UID}")),
        "the Dockerfile's user is no longer {UID}"
    );
    let pod = &r.pod()["spec"];
    let context = &pod["securityContext"];
    assert_eq!(context["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(context["runAsUser"].as_i64(), Some(UID));
    assert_eq!(
        context["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault")
    );
    for name in ["mirror-maker", "join-config"] {
        let c = &r.container(name)["securityContext"];
        assert_eq!(c["runAsNonRoot"].as_bool(), Some(true), "{name}");
        assert_eq!(c["runAsUser"].as_i64(), Some(UID), "{name}");
        assert_eq!(c["readOnlyRootFilesystem"].as_bool(), Some(true), "{name}");
        assert_eq!(
            c["allowPrivilegeEscalation"].as_bool(),
            Some(false),
            "{name}"
        );
        assert_eq!(strings(&c["capabilities"]["drop"]), ["ALL"], "{name}");
        assert_eq!(
            c["seccompProfile"]["type"].as_str(),
            Some("RuntimeDefault"),
            "{name}"
        );
        assert!(
            !r.container(name)["resources"]["limits"]["memory"].is_badvalue(),
            "{name} has no memory limit"
        );
    }

    // Probes on the port the mirror serves its metrics on.
    let mirror = r.container("mirror-maker");
    let port = r
        .arg("--metrics.addr")
        .rsplit_once(':')
        .map(|(_, p)| p.parse::<i64>().unwrap())
        .unwrap();
    let ports = mirror["ports"].as_vec().unwrap();
    let metrics = ports
        .iter()
        .find(|p| p["name"].as_str() == Some("metrics"))
        .expect("a port named metrics");
    assert_eq!(metrics["containerPort"].as_i64(), Some(port));
    for (probe, path) in [
        ("livenessProbe", "/health/live"),
        ("readinessProbe", "/health/ready"),
    ] {
        let get = &mirror[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
        assert_eq!(get["port"].as_str(), Some("metrics"), "{probe}");
    }
    let resources = &mirror["resources"];
    for key in ["cpu", "memory"] {
        assert!(
            !resources["requests"][key].is_badvalue(),
            "no {key} request"
        );
    }

    // Kubernetes waits for the flush (--shutdown.timeout.ms) and the close before SIGKILL.
    let shutdown_ms: u64 = r.arg("--shutdown.timeout.ms").parse().unwrap();
    let grace = pod["terminationGracePeriodSeconds"]
        .as_i64()
        .expect("terminationGracePeriodSeconds") as u64;
    assert!(
        grace * 1000 > shutdown_ms + CLOSE_MS,
        "terminationGracePeriodSeconds {grace} does not cover the flush ({shutdown_ms} ms) and \
         the close ({CLOSE_MS} ms)"
    );

    // The budget and the Service select exactly the Deployment's pods.
    let selector = map_of(&r.deployment()["spec"]["selector"]["matchLabels"]);
    let labels = map_of(&r.pod()["metadata"]["labels"]);
    assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let pdb = r.one("PodDisruptionBudget");
    assert_eq!(pdb["apiVersion"].as_str(), Some("policy/v1"));
    assert_eq!(map_of(&pdb["spec"]["selector"]["matchLabels"]), selector);
    assert_eq!(map_of(&r.one("Service")["spec"]["selector"]), selector);
}

#[test]
fn the_chart_passes_helm_lint_strictly_with_default_and_custom_values() {
    for args in [NAMED.to_vec(), vec!["-f", CUSTOM]] {
        let mut all = vec!["lint", "--strict", CHART];
        all.extend(args);
        let (ok, stdout, stderr) = run_helm(&all);
        assert!(
            ok && stdout.contains("0 chart(s) failed"),
            "{all:?}:\n{stdout}{stderr}"
        );
    }
}

#[test]
fn default_values_render_a_hardened_probed_scraped_group_of_mirrors() {
    let r = Rendered::of(NAMED);
    assert_hardened_probed_and_budgeted(&r);
    assert_eq!(r.deployment()["spec"]["replicas"].as_i64(), Some(2));
    assert_eq!(
        r.arg("--shutdown.timeout.ms"),
        mirror_maker::settings::defaults::SHUTDOWN_TIMEOUT_MS.to_string()
    );
    assert_eq!(
        r.pod()["spec"]["terminationGracePeriodSeconds"].as_i64(),
        Some(90)
    );
    let annotations = map_of(&r.pod()["metadata"]["annotations"]);
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], "9464");
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    assert!(r.all("ServiceMonitor").is_empty());
    assert_eq!(
        r.one("PodDisruptionBudget")["spec"]["maxUnavailable"].as_i64(),
        Some(1)
    );
    // The joined files are what the mirror accepts, with its no-data-loss rules.
    let (_dir, mut consumer, mut producer) = r.joined_configs();
    assert_eq!(consumer.get("group.id"), Some("mirror-maker"));
    consumer.apply_consumer_rules(true).unwrap();
    producer.apply_producer_rules(true).unwrap();
}

#[test]
fn custom_values_render_replicas_of_one_group_with_every_secret_in_the_secret_alone() {
    let r = Rendered::of(&["-f", CUSTOM]);
    assert_hardened_probed_and_budgeted(&r);
    let spec = &r.deployment()["spec"];
    assert_eq!(spec["replicas"].as_i64(), Some(3));
    assert_eq!(
        r.container("mirror-maker")["image"].as_str(),
        Some("registry.example.com/kafka/mirror-maker:1.2.3")
    );
    assert_eq!(r.arg("--whitelist"), "orders|payments");
    assert_eq!(r.arg("--num.streams"), "4");
    assert_eq!(r.arg("--target.topic"), "dr.{topic}");
    assert_eq!(r.arg("--shutdown.timeout.ms"), "60000");
    assert_eq!(
        r.pod()["spec"]["terminationGracePeriodSeconds"].as_i64(),
        Some(120)
    );
    let memory = &r.container("mirror-maker")["resources"]["limits"]["memory"];
    assert_eq!(memory.as_str(), Some("2Gi"));
    assert_eq!(
        r.one("PodDisruptionBudget")["spec"]["minAvailable"].as_i64(),
        Some(2)
    );
    let annotations = map_of(&r.pod()["metadata"]["annotations"]);
    assert!(!annotations.contains_key("prometheus.io/scrape"));

    // Secrets: in the Secret, never in the ConfigMap.
    let secrets = [
        "s3cr3t-scram-password",
        "s3cr3t-key-password",
        "czNjcjN0LXByaXZhdGUta2V5",
    ];
    let configmap = Rendered::entries(r.one("ConfigMap"));
    let secret = Rendered::entries(r.one("Secret"));
    for value in secrets {
        assert!(
            configmap.values().all(|text| !text.contains(value)),
            "{value} in the ConfigMap"
        );
        assert!(
            secret.values().any(|text| text.contains(value)),
            "{value} not in the Secret"
        );
    }
    let (_dir, consumer, producer) = r.joined_configs();
    // Every replica is a member of the one group.
    assert_eq!(consumer.get("group.id"), Some("dr-mirror"));
    assert_eq!(consumer.get("sasl.password"), Some("s3cr3t-scram-password"));
    assert_eq!(
        producer.get("ssl.key.password"),
        Some("s3cr3t-key-password")
    );
    // Whole numbers in the values are written as librdkafka reads them.
    assert_eq!(producer.get("queue.buffering.max.kbytes"), Some("1048576"));
    assert_eq!(producer.get("linger.ms"), Some("5"));
    // Files the configs name are the Secret's, mounted where the configs say.
    let secrets_mount = r.container("mirror-maker")["volumeMounts"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|m| m["name"].as_str() == Some("secrets"))
        .map(|m| m["mountPath"].as_str().unwrap().to_owned())
        .expect("the Secret mounted in the mirror's container");
    for (props, key) in [
        (&consumer, "ssl.ca.location"),
        (&producer, "ssl.ca.location"),
        (&producer, "ssl.certificate.location"),
        (&producer, "ssl.key.location"),
    ] {
        let path = props.get(key).unwrap();
        let file = path
            .strip_prefix(&format!("{secrets_mount}/"))
            .unwrap_or_else(|| panic!("{key} {path} is not in {secrets_mount}"));
        assert!(secret.contains_key(file), "{key}: no {file} in the Secret");
    }
    // The ConfigMap's files hold no secret property at all.
    let dir = mirror_test_harness::tempdir();
    for (name, text) in &configmap {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let role = if name.starts_with("consumer") {
            Role::Consumer
        } else {
            Role::Producer
        };
        let props = ClientProps::load(role, &path).unwrap();
        let secret_keys: Vec<&String> = props.props.keys().filter(|k| is_secret_key(k)).collect();
        assert!(secret_keys.is_empty(), "{name}: {secret_keys:?}");
    }

    // The ServiceMonitor scrapes the Service's metrics port, as job "mirror-maker".
    let monitor = r.one("ServiceMonitor");
    let service = r.one("Service");
    assert_eq!(
        map_of(&monitor["metadata"]["labels"]).get("release"),
        Some(&"prometheus".to_owned())
    );
    let service_labels = map_of(&service["metadata"]["labels"]);
    let wanted = map_of(&monitor["spec"]["selector"]["matchLabels"]);
    assert!(wanted.iter().all(|(k, v)| service_labels.get(k) == Some(v)));
    let job_label = monitor["spec"]["jobLabel"].as_str().unwrap();
    assert_eq!(service_labels[job_label], "mirror-maker");
    assert_eq!(
        strings(&monitor["spec"]["namespaceSelector"]["matchNames"]),
        ["kafka"]
    );
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"].as_str(), Some("metrics"));
    assert_eq!(endpoint["path"].as_str(), Some("/metrics"));
    let port = &service["spec"]["ports"][0];
    assert_eq!(port["name"].as_str(), Some("metrics"));
    assert_eq!(port["targetPort"].as_str(), Some("metrics"));
}

#[test]
fn the_chart_refuses_in_the_configmap_exactly_the_keys_the_mirror_counts_as_secret() {
    for key in [
        "sasl.password",
        "ssl.key.password",
        "ssl.keystore.password",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config",
        "sasl.jaas.config",
        "ssl.key.pem",
        "ssl_key.pem",
        "bootstrap.servers",
        "sasl.username",
        "ssl.key.location",
        "ssl.certificate.pem",
        "client.id",
    ] {
        let set = format!("consumer.properties.{}=x", key.replace('.', "\\."));
        let (ok, _, stderr) = run_helm(&[
            "template",
            "rel",
            CHART,
            NAMED[0],
            NAMED[1],
            "--set-string",
            &set,
        ]);
        if is_secret_key(key) {
            assert!(!ok, "{key} rendered into the ConfigMap");
            assert!(
                stderr.contains(&format!("consumer.properties.{key}"))
                    && stderr.contains("consumer.secretProperties"),
                "{key}: {stderr}"
            );
        } else {
            assert!(ok, "{key} refused: {stderr}");
        }
    }
}

#[test]
fn an_existing_secret_replaces_the_charts_own_and_its_properties_are_joined() {
    let r = Rendered::of(&[
        NAMED[0],
        NAMED[1],
        "--set",
        "existingSecret=mirror-credentials",
    ]);
    assert!(r.all("Secret").is_empty());
    let volumes = r.pod()["spec"]["volumes"].as_vec().unwrap();
    let secrets = volumes
        .iter()
        .find(|v| v["name"].as_str() == Some("secrets"))
        .unwrap();
    assert_eq!(
        secrets["secret"]["secretName"].as_str(),
        Some("mirror-credentials")
    );
    // Without a consumer.toml in that Secret the ConfigMap's file is used as it is.
    let (_dir, consumer, _) = r.joined_configs();
    assert_eq!(consumer.get("bootstrap.servers"), Some("source-kafka:9092"));
}

#[test]
fn a_release_without_a_whitelist_fails_to_render_saying_what_to_set() {
    // Before, the chart mirrored `.*` by default: every topic of the source.
    for args in [vec![], vec!["--set", "whitelist="]] {
        let mut all = vec!["template", "rel", CHART];
        all.extend(args);
        let (ok, _, stderr) = run_helm(&all);
        assert!(!ok, "{all:?} rendered without a whitelist");
        assert!(
            stderr.contains("whitelist is required") && stderr.contains("--set whitelist="),
            "{stderr}"
        );
    }
    let r = Rendered::of(NAMED);
    assert_eq!(r.arg("--whitelist"), "orders|payments");
}

#[test]
fn a_network_policy_lets_only_the_scrapers_reach_the_metrics_port() {
    let r = Rendered::of(NAMED);
    let policy = r.one("NetworkPolicy");
    let spec = &policy["spec"];
    assert_eq!(
        map_of(&spec["podSelector"]["matchLabels"]),
        map_of(&r.deployment()["spec"]["selector"]["matchLabels"]),
        "the mirror's pods"
    );
    assert_eq!(strings(&spec["policyTypes"]), ["Ingress"], "egress open");
    let rules = spec["ingress"].as_vec().expect("ingress rules");
    assert_eq!(rules.len(), 1, "{rules:?}");
    let ports = rules[0]["ports"].as_vec().expect("ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0]["port"].as_i64(), Some(9464));
    let from = rules[0]["from"].as_vec().expect("peers");
    assert_eq!(
        map_of(&from[0]["podSelector"]["matchLabels"]),
        BTreeMap::from([("app.kubernetes.io/name".to_owned(), "prometheus".to_owned())])
    );
    let off = Rendered::of(&[NAMED[0], NAMED[1], "--set", "networkPolicy.enabled=false"]);
    assert!(off.all("NetworkPolicy").is_empty());
}
