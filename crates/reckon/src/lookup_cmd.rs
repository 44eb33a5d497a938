//! `reckon lookup`: support's answer for an order, a key or a provider object id, rendered
//! from the same [`reckon_engine::read::lookup`] as the dashboard and the API. Exits 1 when
//! nothing is found, so a script can tell "no such order" from an answer.

use crate::Format;
use reckon_engine::answer::{Answer, EffectAnswer};
use reckon_engine::audit::neutralise;
use reckon_ledger::Ledger;
use std::io::Write;

/// Print the answer; `Ok(false)` when nothing was found.
pub async fn lookup(
    ledger: &dyn Ledger,
    tenant: &str,
    text: &str,
    format: Format,
) -> anyhow::Result<bool> {
    let t = ledger.tenant_by_slug(tenant).await?;
    let a = reckon_engine::read::lookup(ledger, t.id, text, reckon_domain::time::now())
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .answer;
    let mut out = std::io::stdout().lock();
    match format {
        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&a)?)?,
        Format::Csv => csv_answer(&a, &mut out)?,
        Format::Table => table_answer(&a, &mut out)?,
    }
    out.flush()?;
    Ok(a.found)
}

fn verdict_cell(e: &EffectAnswer) -> String {
    match (e.verdict.as_str(), e.is_final) {
        ("applied", false) => "applied (provisional)".into(),
        (v, _) => v.to_owned(),
    }
}

fn table_answer(a: &Answer, out: &mut impl Write) -> anyhow::Result<()> {
    writeln!(out, "{}", a.sentence)?;
    if !a.effects.is_empty() {
        writeln!(out)?;
        let mut b = tabled::builder::Builder::default();
        b.push_record([
            "what",
            "key",
            "source",
            "verdict",
            "from",
            "application recorded",
            "created",
            "next lookup / resolved",
        ]);
        for e in &a.effects {
            let after = match (
                &e.resolution,
                e.lookup.as_ref().and_then(|l| l.next_lookup.as_ref()),
            ) {
                (Some(r), _) => format!("{} by {}", r.at.text, r.author),
                (None, Some(n)) => n.text.clone(),
                (None, None) if e.needs_person => "needs a person".into(),
                _ => String::new(),
            };
            b.push_record([
                e.label.clone(),
                e.key.clone(),
                e.source.clone(),
                verdict_cell(e),
                format!("{:?}", e.by).to_lowercase(),
                e.recorded.state.to_owned(),
                e.recorded.created.text.clone(),
                after,
            ]);
        }
        writeln!(out, "{}", b.build())?;
    }
    let charges: Vec<(&str, &reckon_engine::answer::ChargeFact)> = a
        .effects
        .iter()
        .flat_map(|e| e.charges.iter().map(move |c| (e.key.as_str(), c)))
        .chain(a.orphans.iter().map(|o| ("(no effect)", &o.charge)))
        .collect();
    if !charges.is_empty() {
        writeln!(out)?;
        let mut b = tabled::builder::Builder::default();
        b.push_record(["charge", "provider", "amount", "status", "created", "for"]);
        for (key, c) in charges {
            let status = match &c.refunded {
                Some(r) => format!("{}, refunded {r}", c.status),
                None => c.status.clone(),
            };
            b.push_record([
                c.id.clone(),
                c.provider.clone(),
                c.amount.clone(),
                status,
                c.created.text.clone(),
                key.to_owned(),
            ]);
        }
        writeln!(out, "{}", b.build())?;
    }
    let findings: Vec<String> = a
        .effects
        .iter()
        .flat_map(|e| e.findings.iter())
        .chain(a.orphans.iter().flat_map(|o| o.findings.iter()))
        .map(|f| {
            format!(
                "audit of {} (run {}): {}: {}",
                f.day, f.run_id, f.kind, f.summary
            )
        })
        .collect();
    for f in findings {
        writeln!(out, "{f}")?;
    }
    // The technical detail behind each sentence, apart from the words read to a customer.
    for e in a.effects.iter().filter(|e| !e.details.is_empty()) {
        writeln!(out)?;
        writeln!(out, "Details, {} ({}):", e.label, e.key)?;
        for d in &e.details {
            writeln!(out, "  {d}")?;
        }
    }
    if a.truncated {
        writeln!(
            out,
            "Only the first {} effects are shown; look up a whole key to narrow it down.",
            reckon_engine::answer::LOOKUP_LIMIT
        )?;
    }
    Ok(())
}

fn csv_answer(a: &Answer, out: &mut impl Write) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_writer(out);
    w.write_record([
        "row",
        "source",
        "key",
        "operation",
        "verdict",
        "final",
        "from",
        "needs_person",
        "recorded_state",
        "created",
        "charges",
        "findings",
        "sentence",
        "label",
        "customer",
        "details",
    ])?;
    for e in &a.effects {
        let row = [
            "effect".to_owned(),
            e.source.clone(),
            e.key.clone(),
            e.operation.clone().unwrap_or_default(),
            e.verdict.as_str().to_owned(),
            e.is_final.to_string(),
            format!("{:?}", e.by).to_lowercase(),
            e.needs_person.to_string(),
            e.recorded.state.to_owned(),
            e.recorded.created.rfc3339.clone(),
            e.charges
                .iter()
                .map(|c| format!("{} {} {}", c.id, c.amount, c.status))
                .collect::<Vec<_>>()
                .join("; "),
            e.findings
                .iter()
                .map(|f| format!("{} {}", f.kind, f.day))
                .collect::<Vec<_>>()
                .join("; "),
            e.sentence.clone(),
            e.label.clone(),
            e.customer.clone().unwrap_or_default(),
            e.details.join(" "),
        ];
        w.write_record(row.iter().map(|c| neutralise(c)))?;
    }
    for o in &a.orphans {
        let c = &o.charge;
        let row = [
            "orphan_charge".to_owned(),
            String::new(),
            c.key.clone().unwrap_or_default(),
            String::new(),
            String::new(),
            String::new(),
            "audit".to_owned(),
            "true".to_owned(),
            String::new(),
            c.created.rfc3339.clone(),
            format!("{} {} {}", c.id, c.amount, c.status),
            o.findings
                .iter()
                .map(|f| format!("{} {}", f.kind, f.day))
                .collect::<Vec<_>>()
                .join("; "),
            o.sentence.clone(),
            String::new(),
            c.customer.clone().unwrap_or_default(),
            String::new(),
        ];
        w.write_record(row.iter().map(|c| neutralise(c)))?;
    }
    w.flush()?;
    Ok(())
}
