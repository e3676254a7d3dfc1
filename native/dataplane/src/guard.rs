//! Who may look a key up on the compiled path, when the router authenticates (router.auth): a bearer token's
//! principal, the tables it may read, and its rate drawn from tokens the Python control plane leases for it from
//! the principal's shared bucket. The path answers only the plain cases — a known token, a table the principal may
//! read, a leased token to spend — and the 401s of a flood of bad tokens; the rest (a table the Python guard has not
//! judged for it, a principal out of leased tokens, an unusual header) goes to the Python path, which decides.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use serde::Deserialize;

/// Header values remembered per thread (router.auth keeps as many accepted values per loaded file).
const MAX_ACCEPTED: usize = 10_000;

pub const NO_CREDENTIALS: &str = "authentication required: send Authorization: Bearer <token>";
pub const NOT_VALID: &str = "the token is not valid";

/// What the Python guard leased of one principal's rate for this path, and how often the path was asked.
#[derive(Debug)]
pub struct Lease {
    pub reads_per_s: f64,
    pub burst: f64,
    pub tokens: AtomicI64,
    /// Lookups of the principal that reached this path since the control plane last looked (its demand).
    pub asked: AtomicU64,
}

impl Lease {
    pub fn give_back(&self) {
        self.tokens.fetch_add(1, Relaxed);
    }

    /// One read admitted from the lease, or false when it is spent (the Python path admits or refuses it).
    fn spend(&self) -> bool {
        self.asked.fetch_add(1, Relaxed);
        if self.tokens.fetch_sub(1, Relaxed) > 0 {
            return true;
        }
        self.tokens.fetch_add(1, Relaxed);
        false
    }
}

#[derive(Debug)]
pub struct Principal {
    /// The tables the Python guard judged this principal may read, of those the routing view names.
    tables: HashSet<String>,
    lease: Option<Arc<Lease>>,
}

/// One loaded auth file as the path needs it: principals by their token's SHA-256.
#[derive(Debug, Default)]
pub struct Principals {
    generation: u64,
    by_token_hash: HashMap<[u8; 32], Arc<Principal>>,
}

#[derive(Deserialize)]
struct RateDoc {
    reads_per_s: f64,
    burst: f64,
}

#[derive(Deserialize)]
struct PrincipalDoc {
    name: String,
    token_sha256: Option<String>,
    tables: Vec<String>,
    rate: Option<RateDoc>,
}

#[derive(Deserialize)]
struct PrincipalsDoc {
    principals: Vec<PrincipalDoc>,
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    let s = s.as_bytes();
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in s.chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

impl Principals {
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// router.data_plane.principals_doc's JSON; `leases` keeps each principal's lease across reloads (a changed
    /// rate starts a new one), and drops those of principals gone.
    pub fn parse(doc: &[u8], generation: u64, leases: &mut HashMap<String, Arc<Lease>>) -> Result<Principals, String> {
        let doc: PrincipalsDoc = serde_json::from_slice(doc).map_err(|e| e.to_string())?;
        let mut by_token_hash = HashMap::new();
        let mut kept = HashMap::new();
        for p in doc.principals {
            let lease = p.rate.map(|r| {
                let same = leases.get(&p.name).filter(|l| l.reads_per_s == r.reads_per_s && l.burst == r.burst);
                let lease = same.cloned().unwrap_or_else(|| Arc::new(Lease {
                    reads_per_s: r.reads_per_s, burst: r.burst, tokens: AtomicI64::new(0), asked: AtomicU64::new(0),
                }));
                kept.insert(p.name.clone(), lease.clone());
                lease
            });
            let Some(digest) = p.token_sha256 else { continue };
            let digest = unhex(&digest).ok_or_else(|| format!("principal {}: token_sha256 is not 64 hex digits", p.name))?;
            by_token_hash.insert(digest, Arc::new(Principal { tables: p.tables.into_iter().collect(), lease }));
        }
        *leases = kept;
        Ok(Principals { generation, by_token_hash })
    }
}

/// What the path does with a lookup's credentials.
#[derive(Debug)]
pub enum Judgement {
    /// Admitted, with the lease it spent a token of: given back if the Python path answers the lookup after all,
    /// which admits it again.
    Admitted(Option<Arc<Lease>>),
    /// 401 with this message (UNAUTHENTICATED), as router.auth.Guard words it.
    Unauthenticated(&'static str),
    /// The Python path decides.
    Python,
}

/// One runtime thread's guard: header values it has accepted, for the principals in force.
#[derive(Default)]
pub struct Guard {
    accepted: RefCell<(u64, HashMap<Vec<u8>, Arc<Principal>>)>,
}

impl Guard {
    /// Judge a lookup of `table` (decoded) with the request's last `Authorization` value.
    pub fn judge(&self, principals: &Principals, authorization: Option<&[u8]>, table: &str) -> Judgement {
        let Some(value) = authorization else { return Judgement::Unauthenticated(NO_CREDENTIALS) };
        let mut accepted = self.accepted.borrow_mut();
        if accepted.0 != principals.generation {
            *accepted = (principals.generation, HashMap::new());
        }
        let principal = match accepted.1.get(value) {
            Some(p) => p.clone(),
            None => match token(value) {
                Token::Python => return Judgement::Python,
                Token::Missing => return Judgement::Unauthenticated(NO_CREDENTIALS),
                Token::Bearer(token) => {
                    let digest = ring::digest::digest(&ring::digest::SHA256, token);
                    let Some(p) = principals.by_token_hash.get(digest.as_ref()) else {
                        return Judgement::Unauthenticated(NOT_VALID);
                    };
                    if accepted.1.len() < MAX_ACCEPTED {
                        accepted.1.insert(value.to_vec(), p.clone());
                    }
                    p.clone()
                }
            },
        };
        if !principal.tables.contains(table) {
            return Judgement::Python;  // not allowed, or a table the guard has not judged for it yet
        }
        match &principal.lease {
            Some(lease) if !lease.spend() => Judgement::Python,
            lease => Judgement::Admitted(lease.clone()),
        }
    }
}

enum Token<'a> {
    Bearer(&'a [u8]),
    Missing,
    Python,
}

/// The token of a `Bearer <token>` value, as router.auth.Guard reads it (the value stripped, split at its first
/// space, the token stripped). A value with bytes other than printable ASCII and spaces goes to the Python path,
/// whose stripping of other whitespace this does not copy.
fn token(value: &[u8]) -> Token<'_> {
    if value.iter().any(|&b| !(0x20..0x7f).contains(&b)) {
        return Token::Python;
    }
    let value = value.trim_ascii();
    if value.is_empty() {
        return Token::Missing;
    }
    let (scheme, token) = match value.iter().position(|&b| b == b' ') {
        Some(i) => (&value[..i], value[i + 1..].trim_ascii()),
        None => (value, &b""[..]),
    };
    if !scheme.eq_ignore_ascii_case(b"bearer") || token.is_empty() {
        return Token::Missing;
    }
    Token::Bearer(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principals(rate: bool) -> (Principals, HashMap<String, Arc<Lease>>) {
        // SHA-256 of "secret"
        let rate = if rate { r#","rate":{"reads_per_s":5,"burst":5}"# } else { "" };
        let doc = format!(r#"{{"principals":[{{"name":"a","token_sha256":
            "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b","tables":["t"]{rate}}},
            {{"name":"b","token_sha256":null,"tables":["t"]}}]}}"#);
        let mut leases = HashMap::new();
        let p = Principals::parse(doc.as_bytes(), 1, &mut leases).unwrap();
        (p, leases)
    }

    #[test]
    fn tokens_are_judged_as_the_python_guard_judges_them() {
        let (p, _) = principals(false);
        let g = Guard::default();
        assert!(matches!(g.judge(&p, Some(b"Bearer secret"), "t"), Judgement::Admitted(_)));
        assert!(matches!(g.judge(&p, Some(b"  bearer   secret  "), "t"), Judgement::Admitted(_)));
        assert!(matches!(g.judge(&p, Some(b"Bearer secret"), "other"), Judgement::Python));
        assert!(matches!(g.judge(&p, None, "t"), Judgement::Unauthenticated(NO_CREDENTIALS)));
        assert!(matches!(g.judge(&p, Some(b""), "t"), Judgement::Unauthenticated(NO_CREDENTIALS)));
        assert!(matches!(g.judge(&p, Some(b"Basic c2VjcmV0"), "t"), Judgement::Unauthenticated(NO_CREDENTIALS)));
        assert!(matches!(g.judge(&p, Some(b"Bearer "), "t"), Judgement::Unauthenticated(NO_CREDENTIALS)));
        assert!(matches!(g.judge(&p, Some(b"Bearer wrong"), "t"), Judgement::Unauthenticated(NOT_VALID)));
        assert!(matches!(g.judge(&p, Some(b"Bearer secret\t"), "t"), Judgement::Python));
        assert!(matches!(g.judge(&p, Some("Bearer sécret".as_bytes()), "t"), Judgement::Python));
        assert_eq!(g.accepted.borrow().1.len(), 2, "only accepted values are remembered");
    }

    #[test]
    fn a_rate_spends_leased_tokens_then_leaves_the_rest_to_python_and_survives_a_reload() {
        let (p, mut leases) = principals(true);
        let g = Guard::default();
        assert!(matches!(g.judge(&p, Some(b"Bearer secret"), "t"), Judgement::Python), "nothing leased yet");
        leases["a"].tokens.fetch_add(2, Relaxed);
        assert!(matches!(g.judge(&p, Some(b"Bearer secret"), "t"), Judgement::Admitted(_)));
        assert!(matches!(g.judge(&p, Some(b"Bearer secret"), "t"), Judgement::Admitted(_)));
        assert!(matches!(g.judge(&p, Some(b"Bearer secret"), "t"), Judgement::Python));
        assert_eq!(leases["a"].tokens.load(Relaxed), 0);
        assert_eq!(leases["a"].asked.load(Relaxed), 4);
        leases["a"].tokens.fetch_add(3, Relaxed);
        let before = leases["a"].clone();
        let same = br#"{"principals":[{"name":"a","token_sha256":null,"tables":[],"rate":{"reads_per_s":5,"burst":5}}]}"#;
        Principals::parse(same, 2, &mut leases).unwrap();
        assert!(Arc::ptr_eq(&before, &leases["a"]), "the same rate keeps its lease");
        let other = br#"{"principals":[{"name":"a","token_sha256":null,"tables":[],"rate":{"reads_per_s":9,"burst":9}}]}"#;
        Principals::parse(other, 3, &mut leases).unwrap();
        assert_eq!(leases["a"].tokens.load(Relaxed), 0, "a new rate starts a new lease");
        Principals::parse(br#"{"principals":[]}"#, 4, &mut leases).unwrap();
        assert!(leases.is_empty());
    }
}
