//! `reckon user ...` and `reckon token list|revoke`: people, their roles per tenant, and
//! the token lifecycle, for the operator. Passwords come from stdin, or are generated and
//! printed once on stdout; they are never taken as flags (flags end up in shell history
//! and in `ps`).

use anyhow::{Context, bail};
use base64::Engine;
use clap::Subcommand;
use rand::RngCore;
use reckon_ledger::{Ledger, Role};
use std::io::Read;

#[derive(Subcommand)]
pub enum UserCmd {
    /// Create a person (or give an existing one a role in another tenant).
    Create {
        /// The person's email address (their sign-in name).
        #[arg(long)]
        email: String,
        /// The tenant's slug.
        #[arg(long)]
        tenant: String,
        /// admin | finance | support | viewer
        #[arg(long)]
        role: String,
        /// Read the password from stdin instead of generating one.
        #[arg(long)]
        password_stdin: bool,
    },
    /// Set a new password (stdin, or generated); ends all of the person's sessions and tokens.
    Password {
        /// The person's email address.
        #[arg(long)]
        email: String,
        /// Read the new password from stdin instead of generating one.
        #[arg(long)]
        password_stdin: bool,
    },
    /// Disable a person: all of their sessions and tokens end now.
    Disable {
        /// The person's email address.
        #[arg(long)]
        email: String,
    },
    /// Let a disabled person sign in again.
    Enable {
        /// The person's email address.
        #[arg(long)]
        email: String,
    },
    /// Turn on a TOTP second factor and print its otpauth:// URL once (or --off).
    Totp {
        /// The person's email address.
        #[arg(long)]
        email: String,
        /// Turn the second factor off instead.
        #[arg(long)]
        off: bool,
    },
}

pub fn parse_role(role: &str) -> anyhow::Result<Role> {
    Role::parse(role)
        .with_context(|| format!("role {role:?} is not one of viewer, support, finance, admin"))
}

fn new_password(from_stdin: bool) -> anyhow::Result<(String, bool)> {
    if from_stdin {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the password from stdin")?;
        let s = s.trim_end_matches(['\n', '\r']).to_owned();
        reckon_web::password::check_policy(&s).map_err(anyhow::Error::msg)?;
        Ok((s, false))
    } else {
        let mut b = [0u8; 18];
        rand::rng().fill_bytes(&mut b);
        Ok((
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b),
            true,
        ))
    }
}

async fn user_id(ledger: &dyn Ledger, email: &str) -> anyhow::Result<i64> {
    Ok(ledger
        .user_by_email(email)
        .await?
        .with_context(|| format!("no user {email:?}"))?
        .user
        .id)
}

pub async fn run(ledger: &dyn Ledger, cmd: UserCmd) -> anyhow::Result<()> {
    match cmd {
        UserCmd::Create {
            email,
            tenant,
            role,
            password_stdin,
        } => {
            let role = parse_role(&role)?;
            let t = ledger.tenant_by_slug(&tenant).await?;
            let id = match ledger.user_by_email(&email).await? {
                Some(existing) => {
                    if password_stdin {
                        bail!(
                            "user {email:?} exists: use `reckon user password` to change a password"
                        );
                    }
                    eprintln!("user {email} exists; setting their role in {tenant}");
                    existing.user.id
                }
                None => {
                    let (password, generated) = new_password(password_stdin)?;
                    let hash = reckon_web::password::hash_blocking(&password);
                    let u = ledger.create_user(&email, &hash).await?;
                    if generated {
                        // Alone on stdout, shown this once.
                        println!("{password}");
                    }
                    eprintln!("user {} created", u.email);
                    u.id
                }
            };
            ledger.set_membership(t.id, id, role).await?;
            eprintln!("{email} is {} in {tenant}", role.as_str());
        }
        UserCmd::Password {
            email,
            password_stdin,
        } => {
            let id = user_id(ledger, &email).await?;
            let (password, generated) = new_password(password_stdin)?;
            let hash = reckon_web::password::hash_blocking(&password);
            ledger.set_password(id, &hash).await?;
            if generated {
                println!("{password}");
            }
            eprintln!("password of {email} changed; their sessions and tokens ended");
        }
        UserCmd::Disable { email } => {
            let id = user_id(ledger, &email).await?;
            ledger.set_user_disabled(id, true).await?;
            eprintln!("{email} disabled; their sessions and tokens ended");
        }
        UserCmd::Enable { email } => {
            let id = user_id(ledger, &email).await?;
            ledger.set_user_disabled(id, false).await?;
            eprintln!("{email} enabled");
        }
        UserCmd::Totp { email, off } => {
            let id = user_id(ledger, &email).await?;
            if off {
                ledger.set_totp_secret(id, None).await?;
                eprintln!("second factor of {email} turned off");
            } else {
                let mut secret = [0u8; 20];
                rand::rng().fill_bytes(&mut secret);
                ledger.set_totp_secret(id, Some(&secret)).await?;
                let encoded = match totp_rs::Secret::Raw(secret.to_vec()).to_encoded() {
                    totp_rs::Secret::Encoded(s) => s,
                    totp_rs::Secret::Raw(_) => unreachable!("to_encoded gives Encoded"),
                };
                println!(
                    "otpauth://totp/reckon:{email}?secret={encoded}&issuer=reckon&algorithm=SHA1&digits=6&period=30"
                );
                eprintln!("second factor of {email} turned on; the URL above is shown once");
            }
        }
    }
    Ok(())
}

pub async fn list_tokens(
    ledger: &dyn Ledger,
    tenant: &str,
    format: crate::Format,
) -> anyhow::Result<()> {
    use crate::output::{rows, when, when_opt};
    let t = ledger.tenant_by_slug(tenant).await?;
    rows(
        &ledger.list_tokens(t.id).await?,
        format,
        &[
            "id",
            "role",
            "label",
            "created_by",
            "created_at",
            "last_used_at",
            "revoked_at",
        ],
        |k| {
            vec![
                k.id.to_string(),
                k.role.as_str().to_owned(),
                k.label.clone(),
                k.created_by.clone().unwrap_or_else(|| "operator".into()),
                when(k.created_at),
                when_opt(k.last_used_at),
                when_opt(k.revoked_at),
            ]
        },
    )
}
