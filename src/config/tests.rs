//! Unit tests of parsing and validation (`from_toml_str`, `from_toml_str_with`, `load`).

use super::*;
use crate::auth::jwt;
use jsonwebtoken::Algorithm;

pub(super) const KEY: &str = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b";

pub(super) fn base_toml() -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
[store]
path = "data/t.db"
[[clients]]
id = "alice"
key_sha256 = "{KEY}"
models = ["demo*"]
[[models]]
id = "demo"
backend = "demo"
approvals = {{ command = "ask" }}
[backends.demo]
kind = "app-server"
command = ["./bin/demo"]
"#
    )
}

pub(super) fn parse(text: &str) -> Result<Config, ConfigError> {
    from_toml_str(text, Path::new("/etc/turnstile"))
}

#[test]
fn valid_config_resolves_paths_and_defaults() {
    let cfg = parse(&base_toml()).unwrap();
    assert_eq!(
        cfg.store,
        StoreConfig::Sqlite {
            path: PathBuf::from("/etc/turnstile/data/t.db")
        }
    );
    let BackendSpec::AppServer(demo) = &cfg.backends["demo"] else {
        panic!("demo is an app-server backend");
    };
    assert_eq!(demo.child.command[0], "/etc/turnstile/./bin/demo");
    assert_eq!(demo.max_sessions, 16);
    assert_eq!(cfg.continuations.max_rounds, 32);
    assert_eq!(cfg.models[0].approvals.command, Decision::Ask);
    assert_eq!(cfg.models[0].approvals.file_change, Decision::Deny);
    assert!(cfg.clients[0].may_use("demo-tool"));
    assert!(!cfg.clients[0].may_use("codex"));
}

#[test]
fn unknown_key_names_its_path() {
    let text = base_toml().replace("max_sessions", "x").replace(
        "kind = \"app-server\"",
        "kind = \"app-server\"\nmax_sesions = 3",
    );
    let e = parse(&text).unwrap_err();
    assert!(
        e.path.contains("backends") && e.path.contains("demo"),
        "{e}"
    );
    assert!(e.message.contains("max_sesions"), "{e}");
}

#[test]
fn unknown_nested_key_in_client() {
    let text = base_toml().replace("models = [\"demo*\"]", "models = [\"demo*\"]\nrole = []");
    let e = parse(&text).unwrap_err();
    assert_eq!(e.path, "clients[0].role", "{e}");
}

#[test]
fn missing_backend_is_an_error() {
    let text = base_toml().replace("backend = \"demo\"", "backend = \"nope\"");
    let e = parse(&text).unwrap_err();
    assert_eq!(e.path, "models[0].backend");
}

#[test]
fn duplicate_ids_are_errors() {
    let mut text = base_toml();
    text.push_str("[[models]]\nid = \"demo\"\nbackend = \"demo\"\n");
    assert_eq!(parse(&text).unwrap_err().path, "models[1].id");

    let mut text = base_toml();
    text.push_str(&format!(
        "[[clients]]\nid = \"alice\"\nkey_sha256 = \"{}\"\n",
        "a".repeat(64)
    ));
    assert_eq!(parse(&text).unwrap_err().path, "clients[1].id");
}

#[test]
fn bad_glob_and_bad_digest() {
    let text = base_toml().replace("[\"demo*\"]", "[\"demo\", \"[oops\"]");
    assert_eq!(parse(&text).unwrap_err().path, "clients[0].models[1]");
    let text = base_toml().replace(KEY, "xyz");
    assert_eq!(parse(&text).unwrap_err().path, "clients[0].key_sha256");
}

#[test]
fn bad_enum_value_names_path() {
    let text = base_toml().replace("command = \"ask\"", "command = \"maybe\"");
    let e = parse(&text).unwrap_err();
    assert_eq!(e.path, "models[0].approvals.command", "{e}");
}

#[test]
fn store_path_that_is_a_folder_fails_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let cfg_path = dir.path().join("t.toml");
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::create_dir(dir.path().join("data/t.db")).unwrap();
    std::fs::write(&cfg_path, base_toml()).unwrap();
    let e = load(&cfg_path).unwrap_err();
    assert_eq!(e.path, "store.path");
}

const PUBLIC: &str = include_str!("../../fixtures/jwt/issuer-public.pem");
const PRIVATE: &str = include_str!("../../fixtures/jwt/issuer-private.pem");
const JWKS: &str = include_str!("../../fixtures/jwt/other-jwks.json");

/// Key files by absolute path, as `load` would read them under `/etc/turnstile`.
fn files(p: &Path) -> std::io::Result<Vec<u8>> {
    match p.to_str().unwrap_or_default() {
        "/etc/turnstile/keys/idp.pem" => Ok(PUBLIC.into()),
        "/etc/turnstile/keys/private.pem" => Ok(PRIVATE.into()),
        "/keys/jwks.json" => Ok(JWKS.into()),
        _ => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
    }
}

pub(super) const ISSUER: &str = r#"
[[auth.jwt]]
issuer = "https://idp.test"
audiences = ["turnstile"]
algorithms = ["RS256"]
pem_file = "keys/idp.pem"
"#;

pub(super) fn jwt_toml(issuer: &str, client: &str) -> String {
    format!("{}{issuer}{client}", base_toml())
}

pub(super) fn parse_jwt(text: &str) -> Result<Config, ConfigError> {
    from_toml_str_with(text, Path::new("/etc/turnstile"), &files)
}

#[test]
fn jwt_issuer_defaults_and_relative_key_path() {
    let cfg = parse_jwt(&jwt_toml(ISSUER, "")).unwrap();
    let i = &cfg.jwt[0];
    assert_eq!(i.issuer, "https://idp.test");
    assert_eq!(i.leeway_seconds, 30);
    assert_eq!(i.algorithms, vec![Algorithm::RS256]);
    assert!(matches!(i.keys, jwt::Keys::Pem(_)));
    assert!(i.roles.is_empty() && i.require.is_empty() && i.typ.is_none());
    assert_eq!(i.limits, ClientLimits::default());
    // Unnamed subjects get the issuer's defaults: no models unless granted.
    let g = cfg.grant("jwt:https://idp.test#sam", &[]).unwrap();
    assert!(!g.may_use("demo") && !g.approver());
    assert!(cfg.grant("jwt:https://other.test#sam", &[]).is_none());
    assert!(cfg.grant("alice", &[]).unwrap().may_use("demo"));

    let jwks = ISSUER
        .replace("pem_file = \"keys/idp.pem\"", "jwks_file = \"/keys/jwks.json\"")
        .replace("audiences", "models = [\"demo*\"]\nroles = [\"approver\"]\nrequests_per_minute = 60\nburst = 2\nconcurrent_executions = 3\nmax_suspended = 1\naudiences");
    let cfg = parse_jwt(&jwt_toml(&jwks, "")).unwrap();
    let i = &cfg.jwt[0];
    assert!(matches!(&i.keys, jwt::Keys::Jwks(k) if k.len() == 1 && k[0].kid == "other-1"));
    let g = cfg.grant("jwt:https://idp.test#sam", &[]).unwrap();
    assert!(g.may_use("demo") && g.approver());
    assert_eq!(g.limits().rate.unwrap().burst.get(), 2);
    assert_eq!(g.limits().rate.unwrap().per_minute.get(), 60);
    assert_eq!(
        (g.limits().concurrent_executions, g.limits().max_suspended),
        (Some(3), Some(1))
    );
    // `from_toml_str` reads no files: the error names the key that needed one.
    let e = from_toml_str(&jwt_toml(ISSUER, ""), Path::new("/etc/turnstile")).unwrap_err();
    assert_eq!(e.path, "auth.jwt[0].pem_file", "{e}");
}

#[test]
fn jwt_issuer_errors_name_their_key_path() {
    const RS: &str = "algorithms = [\"RS256\"]";
    const PEM: &str = "pem_file = \"keys/idp.pem\"";
    const AUD: &str = "audiences = [\"turnstile\"]";
    // Each case: replacements applied to ISSUER, and the key path the error must name.
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[(RS, "algorithms = [\"none\"]")],
            "auth.jwt[0].algorithms[0]",
        ),
        (
            &[(RS, "algorithms = [\"RS256\", \"HS256\"]")],
            "auth.jwt[0].algorithms[1]",
        ),
        (
            &[(RS, "algorithms = [\"RS256\", \"ES256\"]")],
            "auth.jwt[0].algorithms[1]",
        ),
        (
            &[(RS, "algorithms = [\"XX1\"]")],
            "auth.jwt[0].algorithms[0]",
        ),
        (&[(RS, "algorithms = []")], "auth.jwt[0].algorithms"),
        // EC algorithms cannot use an RSA key.
        (&[(RS, "algorithms = [\"ES256\"]")], "auth.jwt[0].pem_file"),
        (&[(AUD, "audiences = []")], "auth.jwt[0].audiences"),
        (&[("idp.test\"", "idp.test#x\"")], "auth.jwt[0].issuer"),
        (&[(PEM, "")], "auth.jwt[0].pem_file"),
        (
            &[(
                PEM,
                "pem_file = \"keys/idp.pem\"\njwks_file = \"/keys/jwks.json\"",
            )],
            "auth.jwt[0].jwks_file",
        ),
        (
            &[(PEM, "pem_file = \"keys/missing.pem\"")],
            "auth.jwt[0].pem_file",
        ),
        (
            &[(PEM, "pem_file = \"keys/private.pem\"")],
            "auth.jwt[0].pem_file",
        ),
        (
            &[(PEM, "jwks_file = \"keys/idp.pem\"")],
            "auth.jwt[0].jwks_file",
        ),
        // The JWK says RS256; the issuer allows only PS256.
        (
            &[
                (PEM, "jwks_file = \"/keys/jwks.json\""),
                (RS, "algorithms = [\"PS256\"]"),
            ],
            "auth.jwt[0].jwks_file",
        ),
        (
            &[(AUD, "audiences = [\"t\"]\nleeway_seconds = 301")],
            "auth.jwt[0].leeway_seconds",
        ),
        (
            &[(AUD, "audiences = [\"t\"]\nrequire = [\"\"]")],
            "auth.jwt[0].require[0]",
        ),
        (
            &[(AUD, "audiences = [\"t\"]\nleway_seconds = 3")],
            "auth.jwt[0].leway_seconds",
        ),
        (
            &[(AUD, "audiences = [\"t\"]\nroles = [\"admin\"]")],
            "auth.jwt[0].roles[0]",
        ),
        (
            &[(AUD, "audiences = [\"t\"]\nmodels = [\"[x\"]")],
            "auth.jwt[0].models[0]",
        ),
        (
            &[(AUD, "audiences = [\"t\"]\nmax_suspended = 0")],
            "auth.jwt[0].max_suspended",
        ),
    ];
    for (edits, path) in cases {
        let mut issuer = ISSUER.to_string();
        for (from, to) in edits.iter() {
            assert!(issuer.contains(from), "{from}");
            issuer = issuer.replace(from, to);
        }
        let e = parse_jwt(&jwt_toml(&issuer, "")).expect_err(path);
        assert_eq!(e.path, *path, "{edits:?}: {e}");
    }
    let twice = format!("{ISSUER}{ISSUER}");
    assert_eq!(
        parse_jwt(&jwt_toml(&twice, "")).unwrap_err().path,
        "auth.jwt[1].issuer"
    );
}

#[test]
fn clients_name_a_key_or_a_jwt_subject() {
    let jwt_client = "[[clients]]\nid = \"sam\"\njwt = { issuer = \"https://idp.test\", subject = \"sam-1\" }\nrequests_per_minute = 10\n";
    let cfg = parse_jwt(&jwt_toml(ISSUER, jwt_client)).unwrap();
    let sam = cfg.jwt_client("https://idp.test", "sam-1").unwrap();
    assert_eq!(&*sam.id, "sam");
    assert_eq!(
        sam.credential,
        Credential::Jwt {
            issuer: "https://idp.test".into(),
            subject: "sam-1".into()
        }
    );
    assert_eq!(
        sam.limits.rate.unwrap().burst.get(),
        10,
        "burst defaults to the rate"
    );
    assert!(cfg.grant("sam", &[]).unwrap().may_use("demo"));

    let key = format!("key_sha256 = \"{KEY}\"\n");
    let cases: Vec<(String, &str)> = vec![
        (
            jwt_client.replace("jwt =", &format!("{key}jwt =")),
            "clients[1].jwt",
        ),
        (
            jwt_client.replace(
                "jwt = { issuer = \"https://idp.test\", subject = \"sam-1\" }\n",
                "",
            ),
            "clients[1].key_sha256",
        ),
        (
            jwt_client.replace("idp.test\"", "nope.test\""),
            "clients[1].jwt.issuer",
        ),
        (
            jwt_client.replace("\"sam-1\"", "\"\""),
            "clients[1].jwt.subject",
        ),
        (
            jwt_client.replace(" }", ", tenant = \"x\" }"),
            "clients[1].jwt.tenant",
        ),
        (
            jwt_client.replace("id = \"sam\"", "id = \"jwt:sam\""),
            "clients[1].id",
        ),
        (
            format!("{jwt_client}{}", jwt_client.replace("\"sam\"", "\"sam2\"")),
            "clients[2].jwt",
        ),
        (
            jwt_client.replace("= 10", "= 0"),
            "clients[1].requests_per_minute",
        ),
        (
            jwt_client.replace("requests_per_minute", "burst"),
            "clients[1].burst",
        ),
        (
            jwt_client.replace("requests_per_minute = 10", "concurrent_executions = 0"),
            "clients[1].concurrent_executions",
        ),
    ];
    for (client, path) in cases {
        let e = parse_jwt(&jwt_toml(ISSUER, &client)).expect_err(path);
        assert_eq!(e.path, path, "{client}: {e}");
    }
}

#[test]
fn a_postgres_store_and_a_cluster_are_read_exactly_and_secrets_stay_out_of_the_file() {
    let pg = base_toml().replace(
        "[store]\npath = \"data/t.db\"",
        "[store]\nurl = \"postgres://turnstile@127.0.0.1:5432/turnstile\"\npassword_env = \"TURNSTILE_PG_PASSWORD\"",
    );
    let cluster = format!(
        "{pg}\n[cluster]\nreplica_id = \"a\"\ninternal_listen = \"127.0.0.1:0\"\nadvertise_url = \"http://10.0.0.5:8788/\"\nkey_env = \"TURNSTILE_CLUSTER_KEY\"\n"
    );
    let cfg = parse(&cluster).unwrap();
    assert_eq!(
        cfg.store,
        StoreConfig::Postgres {
            url: "postgres://turnstile@127.0.0.1:5432/turnstile".into(),
            password_env: Some("TURNSTILE_PG_PASSWORD".into()),
            pool_size: crate::store::default_pool_size(),
        }
    );
    let c = cfg.cluster.unwrap();
    assert_eq!(c.replica_id, "a");
    assert_eq!(c.internal_listen.port(), 0);
    assert_eq!(c.advertise_url.as_deref(), Some("http://10.0.0.5:8788"));
    assert_eq!(c.key_env, "TURNSTILE_CLUSTER_KEY");
    assert_eq!(c.lease, Duration::from_secs(10));
    assert!(parse(&base_toml()).unwrap().cluster.is_none());

    let refused = [
        (
            pg.replace("turnstile@127", "turnstile:secret@127"),
            "store.url",
        ),
        (pg.replace("postgres://", "mysql://"), "store.url"),
        (
            pg.replace("[store]\n", "[store]\npath = \"x.db\"\n"),
            "store",
        ),
        (
            base_toml().replace("path = \"data/t.db\"", "path = \"data/t.db\"\npassword_env = \"P\""),
            "store.password_env",
        ),
        (pg.replace("TURNSTILE_PG_PASSWORD", "not a name"), "store.password_env"),
        (
            format!("{}\n[cluster]\nreplica_id = \"a\"\ninternal_listen = \"127.0.0.1:0\"\nkey_env = \"K\"\n", base_toml()),
            "cluster",
        ),
        (cluster.replace("replica_id = \"a\"", "replica_id = \"a b\""), "cluster.replica_id"),
        (
            cluster.replace("internal_listen = \"127.0.0.1:0\"", "internal_listen = \"nowhere\""),
            "cluster.internal_listen",
        ),
        (cluster.replace("http://10.0.0.5:8788/", "10.0.0.5"), "cluster.advertise_url"),
        (cluster.replace("key_env = \"TURNSTILE_CLUSTER_KEY\"", "key_env = \"\""), "cluster.key_env"),
        (format!("{cluster}lease_seconds = 0\n"), "cluster.lease_seconds"),
    ];
    for (text, path) in refused {
        assert_eq!(parse(&text).unwrap_err().path, path, "{text}");
    }
    // A misspelt key names its path.
    let e = parse(&format!("{cluster}lease = 3\n")).unwrap_err();
    assert!(e.path.starts_with("cluster"), "{e:?}");
}

#[test]
fn stream_and_kept_bytes_bounds() {
    let cfg = parse(&base_toml()).unwrap();
    // A quarter of the 1024 connections; 64 MiB of kept conversation.
    assert_eq!(cfg.server.max_streams_per_client, 256);
    assert_eq!(cfg.continuations.max_kept_bytes_per_client, 64 << 20);
    assert_eq!(cfg.clients[0].limits.max_streams, None);
    let few = base_toml().replace("listen =", "max_connections = 3\nlisten =");
    assert_eq!(parse(&few).unwrap().server.max_streams_per_client, 1);
    let set = base_toml()
        .replace("listen =", "max_streams_per_client = 7\nlisten =")
        .replace(
            "models = [\"demo*\"]",
            "models = [\"demo*\"]\nmax_streams = 2",
        );
    let cfg = parse(&set).unwrap();
    assert_eq!(cfg.server.max_streams_per_client, 7);
    assert_eq!(cfg.clients[0].limits.max_streams, Some(2));
    for (text, path) in [
        (
            base_toml().replace("listen =", "max_streams_per_client = 0\nlisten ="),
            "server.max_streams_per_client",
        ),
        (
            base_toml().replace(
                "models = [\"demo*\"]",
                "models = [\"demo*\"]\nmax_streams = 0",
            ),
            "clients[0].max_streams",
        ),
        (
            format!(
                "{}\n[continuations]\nmax_kept_bytes_per_client = 0\n",
                base_toml()
            ),
            "continuations.max_kept_bytes_per_client",
        ),
    ] {
        assert_eq!(parse(&text).unwrap_err().path, path);
    }
}

#[test]
fn prices_and_budgets_are_read_in_nano_usd_and_unpriced_models_warn() {
    use crate::budget::{nanos, Price};
    let text = base_toml().replace(
        "models = [\"demo*\"]",
        "models = [\"demo*\"]\nbudget = { usd_per_day = 20.0, tokens_per_day = 5000000, usd_per_execution = 0.5 }",
    ) + r#"
[[models]]
id = "demo-priced"
backend = "demo"
price = { input_per_mtok = 1.25, cached_input_per_mtok = 0.125, output_per_mtok = 10.0 }
"#;
    let cfg = parse(&text).unwrap();
    let b = cfg.clients[0].limits.budget;
    assert_eq!(b.usd_per_day, Some(nanos(20.0)));
    assert_eq!((b.usd_per_month, b.tokens_per_day), (None, Some(5_000_000)));
    assert_eq!(b.usd_per_execution, Some(nanos(0.5)));
    // An unpriced cache write costs the uncached input price.
    assert_eq!(
        cfg.model("demo-priced").unwrap().price,
        Some(Price {
            input: nanos(1.25),
            cached_input: nanos(0.125),
            cache_write: nanos(1.25),
            output: nanos(10.0),
        })
    );
    assert_eq!(cfg.model("demo").unwrap().price, None);
    let w = cfg.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("clients `alice`") && w[0].contains("`demo`"),
        "{w:?}"
    );
    // A tokens-only budget needs no price.
    let tokens_only = base_toml().replace(
        "models = [\"demo*\"]",
        "models = [\"demo*\"]\nbudget = { tokens_per_day = 10 }",
    );
    assert!(parse(&tokens_only).unwrap().warnings().is_empty());

    for (bad, path) in [
        (
            "budget = { usd_per_day = -1.0 }",
            "clients[0].budget.usd_per_day",
        ),
        ("budget = { usd_per_week = 1.0 }", "usd_per_week"),
        (
            "budget = { tokens_per_day = 0 }",
            "clients[0].budget.tokens_per_day",
        ),
        (
            "budget = { usd_per_execution = 0.0 }",
            "clients[0].budget.usd_per_execution",
        ),
    ] {
        let text = base_toml().replace(
            "models = [\"demo*\"]",
            &format!("models = [\"demo*\"]\n{bad}"),
        );
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains(path), "{e}");
    }
    let bad_price = base_toml().replace(
        "approvals = { command = \"ask\" }",
        "approvals = { command = \"ask\" }\nprice = { output_per_mtok = nan }",
    );
    let e = parse(&bad_price).unwrap_err().to_string();
    assert!(e.contains("models[0].price.output_per_mtok"), "{e}");
}

#[test]
fn the_container_config_is_the_demo_config_with_the_images_paths() {
    let read = |f: &str| -> toml::Table {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config").join(f);
        std::fs::read_to_string(path).unwrap().parse().unwrap()
    };
    let (mut demo, mut image) = (read("turnstile.toml"), read("container.toml"));
    let mut differing = Vec::new();
    for doc in [&mut demo, &mut image] {
        let take = |doc: &mut toml::Table, at: &[&str]| {
            let (key, tables) = at.split_last().unwrap();
            let t = (tables.iter()).fold(doc, |t, k| t[*k].as_table_mut().unwrap());
            t.remove(*key).unwrap().to_string()
        };
        differing.push([
            take(doc, &["server", "listen"]),
            take(doc, &["store", "path"]),
            take(doc, &["backends", "demo", "command"]),
        ]);
    }
    assert_eq!(
        demo, image,
        "only the listener, store and backend paths differ"
    );
    assert_eq!(
        differing[1],
        [
            "\"0.0.0.0:8787\"",
            "\"../../data/turnstile.db\"",
            "[\"../../usr/local/bin/turnstile-demo-backend\"]"
        ]
        .map(String::from)
    );
}
