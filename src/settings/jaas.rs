//! `sasl.jaas.config` as Java's clients write it: the login module and its options, read far
//! enough to take the `username` and `password` of the PLAIN and SCRAM modules into
//! librdkafka's `sasl.username` and `sasl.password` ([`super::java`]). Errors never hold an
//! option's value: a password is never a piece of a message.

const PLAIN_MODULE: &str = "org.apache.kafka.common.security.plain.PlainLoginModule";
const SCRAM_MODULE: &str = "org.apache.kafka.common.security.scram.ScramLoginModule";

/// The `username` and `password` of a PLAIN or SCRAM `sasl.jaas.config`. Errors never hold an
/// option's value.
pub(super) fn credentials(text: &str) -> Result<(String, String), String> {
    let (module, options) = parse_jaas(text)?;
    match module.as_str() {
        PLAIN_MODULE | SCRAM_MODULE => {}
        "com.sun.security.auth.module.Krb5LoginModule" => {
            return Err(
                "`sasl.jaas.config` uses Kerberos (Krb5LoginModule), which librdkafka sets up \
                 with its own properties: remove `sasl.jaas.config` and set \
                 `sasl.mechanism=GSSAPI`, `sasl.kerberos.service.name`, \
                 `sasl.kerberos.principal` and `sasl.kerberos.keytab` (librdkafka runs \
                 `sasl.kerberos.kinit.cmd`)"
                    .to_owned(),
            )
        }
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule" => {
            return Err(
                "`sasl.jaas.config` uses OAUTHBEARER (OAuthBearerLoginModule), which librdkafka \
                 sets up with its own properties: remove `sasl.jaas.config` and set \
                 `sasl.mechanism=OAUTHBEARER`, `sasl.oauthbearer.method=oidc`, \
                 `sasl.oauthbearer.client.id`, `sasl.oauthbearer.client.secret`, \
                 `sasl.oauthbearer.token.endpoint.url` (and `sasl.oauthbearer.scope`)"
                    .to_owned(),
            )
        }
        other => {
            return Err(format!(
                "`sasl.jaas.config` uses the login module {other}, a Java class librdkafka \
                 cannot run: librdkafka authenticates with PLAIN or SCRAM (`sasl.username`, \
                 `sasl.password`), GSSAPI (`sasl.kerberos.*`) or OAUTHBEARER \
                 (`sasl.oauthbearer.*`)"
            ))
        }
    }
    let option = |name: &str| {
        options
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| {
                format!("`sasl.jaas.config` ({module}) has no `{name}` option; it needs both `username` and `password`")
            })
    };
    if options
        .iter()
        .any(|(k, v)| k == "tokenauth" && v.eq_ignore_ascii_case("true"))
    {
        return Err(
            "`sasl.jaas.config` authenticates with a delegation token (tokenauth=true), which \
             librdkafka does not support"
                .to_owned(),
        );
    }
    Ok((option("username")?, option("password")?))
}

/// `Module flag key=value ... ;` (Java's JAAS syntax, one login module, as Kafka requires).
fn parse_jaas(text: &str) -> Result<(String, Vec<(String, String)>), String> {
    let tokens = jaas_tokens(text)?;
    let bad = |what: &str| Err(format!("`sasl.jaas.config` is not valid JAAS: {what}"));
    let mut it = tokens.into_iter().peekable();
    let Some(Token::Word(module)) = it.next() else {
        return bad("it must start with a login module class");
    };
    match it.next() {
        Some(Token::Word(flag))
            if ["required", "requisite", "sufficient", "optional"]
                .contains(&flag.to_ascii_lowercase().as_str()) => {}
        _ => {
            return bad(
                "the login module must be followed by required, requisite, sufficient or optional",
            )
        }
    }
    let mut options: Vec<(String, String)> = Vec::new();
    // An option is named by its place, never by its name: a name may be a piece of a value
    // (`password=Secret Part2` reads `Part2` as the next option's name).
    let option = |options: &[(String, String)]| {
        let place = options.len() + 1;
        match options.last() {
            Some((name, _)) if ["username", "password"].contains(&name.as_str()) => {
                format!("option {place} (the one after `{name}`)")
            }
            _ => format!("option {place}"),
        }
    };
    const QUOTE: &str = "options are name=value separated by spaces; quote a value that holds                          a space, `=` or `;` (password=\"...\")";
    loop {
        match it.next() {
            None | Some(Token::End) => break,
            Some(Token::Word(name)) => {
                if it.next() != Some(Token::Equals) {
                    return Err(format!(
                        "`sasl.jaas.config` is not valid JAAS: {} has no `=`; {QUOTE}",
                        option(&options)
                    ));
                }
                match it.next() {
                    Some(Token::Word(v)) | Some(Token::Quoted(v)) => options.push((name, v)),
                    _ => {
                        return Err(format!(
                            "`sasl.jaas.config` is not valid JAAS: {} has no value; {QUOTE}",
                            option(&options)
                        ))
                    }
                }
            }
            Some(_) => return bad(&format!("{} has no name; {QUOTE}", option(&options))),
        }
    }
    if it.peek().is_some() {
        return bad("it holds more than one login module; Kafka's clients take exactly one");
    }
    Ok((module, options))
}

#[derive(Debug, PartialEq, Eq)]
enum Token {
    Word(String),
    Quoted(String),
    Equals,
    End,
}

fn jaas_tokens(text: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '=' => {
                chars.next();
                tokens.push(Token::Equals);
            }
            ';' => {
                chars.next();
                tokens.push(Token::End);
            }
            '"' => {
                chars.next();
                let mut value = String::new();
                loop {
                    match chars.next() {
                        None => return Err(
                            "`sasl.jaas.config` is not valid JAAS: a quoted value is not closed"
                                .to_owned(),
                        ),
                        Some('"') => break,
                        Some('\\') => value.extend(chars.next()),
                        Some(c) => value.push(c),
                    }
                }
                tokens.push(Token::Quoted(value));
            }
            _ => {
                let mut word = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || c == '=' || c == ';' || c == '"' {
                        break;
                    }
                    word.push(c);
                    chars.next();
                }
                tokens.push(Token::Word(word));
            }
        }
    }
    Ok(tokens)
}
