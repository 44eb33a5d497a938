//! `reckon user ...` and `reckon token list|revoke`: people, their roles per tenant, and
//! the token lifecycle, for the operator. Passwords come from stdin, or are generated and
//! printed once on stdout; they are never taken as flags (flags end up in shell history
//! and in `ps`).

use anyhow::{Context, bail};
use base64::Engine;
use clap::Subcommand;
use rand::RngCore;
use reckon_engine::commands::{self, AccountChange, Via};
use reckon_ledger::Ledger;
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
    /// Lift every sign-in lock of an account, whoever's failures set it (a new password
    /// lifts them too).
    Unlock {
        /// The account's email address (as typed at sign-in; it need not exist).
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

async fn account(
    ledger: &dyn Ledger,
    email: &str,
    change: AccountChange<'_>,
) -> Result<(), commands::CommandError> {
    commands::change_account(ledger, crate::OPERATOR, Via::Cli, email, change).await?;
    Ok(())
}

/// Every change here is the operator's, through the CLI, and is written to the audit log of
/// each tenant it concerns.
pub async fn run(
    ledger: &dyn Ledger,
    egress: &reckon_sources::EgressPolicy,
    cmd: UserCmd,
) -> anyhow::Result<()> {
    match cmd {
        UserCmd::Create {
            email,
            tenant,
            role,
            password_stdin,
        } => {
            let t = ledger.tenant_by_slug(&tenant).await?;
            // Hashed only for an account that is new: the hash is slow on purpose.
            let exists = ledger.user_by_email(&email).await?.is_some();
            if exists && password_stdin {
                bail!("user {email:?} exists: use `reckon user password` to change a password");
            }
            let password = if exists {
                eprintln!("user {email} exists; setting their role in {tenant}");
                None
            } else {
                Some(new_password(password_stdin)?)
            };
            let hash = password
                .as_ref()
                .map(|(p, _)| reckon_web::password::hash_blocking(p));
            let member = commands::Member {
                email: &email,
                role: &role,
                acting_user: None,
                new_account: hash.as_deref(),
            };
            let (person, role, created) =
                commands::set_member(&crate::operator(ledger, egress, &t), member).await?;
            if created {
                if let Some((password, true)) = &password {
                    // Alone on stdout, shown this once.
                    println!("{password}");
                }
                eprintln!("user {} created", person.email);
            }
            eprintln!("{} is {} in {tenant}", person.email, role.as_str());
        }
        UserCmd::Password {
            email,
            password_stdin,
        } => {
            // The account is looked up before a password is read or made.
            if ledger.user_by_email(&email).await?.is_none() {
                bail!("no user {email:?}");
            }
            let (password, generated) = new_password(password_stdin)?;
            let hash = reckon_web::password::hash_blocking(&password);
            account(ledger, &email, AccountChange::Password(&hash)).await?;
            if generated {
                println!("{password}");
            }
            eprintln!("password of {email} changed; their sessions and tokens ended");
        }
        UserCmd::Disable { email } => {
            account(ledger, &email, AccountChange::Disabled(true)).await?;
            eprintln!("{email} disabled; their sessions and tokens ended");
        }
        UserCmd::Unlock { email } => {
            let n = ledger.unlock_account(&email).await?;
            eprintln!("sign-in locks of {email} lifted ({n} sender(s) cleared)");
        }
        UserCmd::Enable { email } => {
            account(ledger, &email, AccountChange::Disabled(false)).await?;
            eprintln!("{email} enabled");
        }
        UserCmd::Totp { email, off } => {
            if off {
                account(ledger, &email, AccountChange::SecondFactor(None)).await?;
                eprintln!("second factor of {email} turned off");
            } else {
                let mut secret = [0u8; 20];
                rand::rng().fill_bytes(&mut secret);
                account(ledger, &email, AccountChange::SecondFactor(Some(&secret))).await?;
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
    let tz = crate::output::tenant_zone(ledger, t.id).await?;
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
                when(k.created_at, &tz),
                when_opt(k.last_used_at, &tz),
                when_opt(k.revoked_at, &tz),
            ]
        },
    )
}
