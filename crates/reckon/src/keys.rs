//! `reckon keys generate|rotate`: the master key that seals DSNs, provider secrets and TOTP
//! secrets at rest.

use crate::config::Settings;
use anyhow::{Context, bail};
use clap::Subcommand;
use reckon_ledger::{Keyring, Ledger};

pub const KEY_FILE: &str = "master.key";
/// A rotated key waits here until the ledger has committed to it.
pub const PENDING_KEY_FILE: &str = "master.key.new";

#[derive(Subcommand)]
pub enum KeysCmd {
    /// Print a new random master key (32 bytes, base64) for RECKON_MASTER_KEY (no ledger
    /// needed).
    Generate,
    /// Re-seal every stored secret under a new master key, in one transaction.
    ///
    /// With RECKON_MASTER_KEY set, the new key comes from the environment variable named by
    /// --new-key-env; afterwards set RECKON_MASTER_KEY to it on every replica. With the key
    /// file of the embedded default, a new key is made and the file replaced.
    Rotate {
        /// With RECKON_MASTER_KEY: the name of the environment variable holding the new key.
        #[arg(long)]
        new_key_env: Option<String>,
    },
}

pub async fn run(ledger: &dyn Ledger, cmd: KeysCmd, settings: &Settings) -> anyhow::Result<()> {
    match cmd {
        KeysCmd::Generate => unreachable!("handled before the ledger is opened"),
        KeysCmd::Rotate { new_key_env } => match (&settings.master_key, new_key_env) {
            (Some(_), Some(var)) => {
                let b64 = std::env::var(&var).with_context(|| format!("{var} is not set"))?;
                let new = Keyring::from_base64(&b64).with_context(|| format!("reading {var}"))?;
                let r = ledger.rotate_keyring(&new).await?;
                eprintln!(
                    "re-sealed {} DSNs, {} provider secrets, {} TOTP secrets ({} already under the new key). \
                     Set RECKON_MASTER_KEY to the new key on every replica before they next start: \
                     the old key no longer opens this ledger.",
                    r.source_dsns, r.provider_secrets, r.totp_secrets, r.already_rotated
                );
            }
            (Some(_), None) => bail!(
                "RECKON_MASTER_KEY is set: pass the new key in an environment variable named by \
                 --new-key-env (make one with `reckon keys generate`)"
            ),
            (None, Some(_)) => bail!(
                "--new-key-env is for ledgers keyed by RECKON_MASTER_KEY; this one uses the key \
                 file in the data directory, which rotation replaces itself"
            ),
            (None, None) => {
                let dir = &settings.data_dir;
                let pending = dir.join(PENDING_KEY_FILE);
                if pending.exists() {
                    bail!(
                        "{} exists: an earlier rotation did not finish. Start reckon once (it \
                         finishes the rotation) or remove the file if that rotation never ran",
                        pending.display()
                    );
                }
                let b64 = Keyring::generate_base64();
                // The new key is saved before the ledger commits to it, and becomes the
                // key file only after: a crash anywhere leaves a key that opens the ledger.
                Keyring::write_file(&pending, &b64)?;
                let r = ledger.rotate_keyring(&Keyring::from_base64(&b64)?).await?;
                std::fs::rename(&pending, dir.join(KEY_FILE))
                    .context("replacing the master key file")?;
                eprintln!(
                    "re-sealed {} DSNs, {} provider secrets, {} TOTP secrets under a new key in {}",
                    r.source_dsns,
                    r.provider_secrets,
                    r.totp_secrets,
                    dir.join(KEY_FILE).display()
                );
            }
        },
    }
    Ok(())
}
