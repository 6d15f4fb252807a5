//! Markdown tables, printed as they complete and gathered for `--out`.

use std::fmt::Write as _;

pub struct Table {
    pub title: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

impl Table {
    pub fn new(title: impl Into<String>, header: &[&str]) -> Self {
        Table {
            title: title.into(),
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }
    pub fn note(&mut self, n: impl Into<String>) {
        self.notes.push(n.into());
    }
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "#### {}\n", self.title);
        let _ = writeln!(s, "| {} |", self.header.join(" | "));
        let _ = writeln!(s, "|{}", self.header.iter().map(|_| " --- |").collect::<String>());
        for r in &self.rows {
            let _ = writeln!(s, "| {} |", r.join(" | "));
        }
        if !self.notes.is_empty() {
            s.push('\n');
            for n in &self.notes {
                let _ = writeln!(s, "- {n}");
            }
        }
        s
    }
}

/// Everything printed, for `--out`.
#[derive(Default)]
pub struct Report {
    pub text: String,
}

impl Report {
    pub fn table(&mut self, t: &Table) {
        let md = t.markdown();
        println!("{md}");
        self.text.push_str(&md);
        self.text.push('\n');
    }
    pub fn line(&mut self, l: impl AsRef<str>) {
        println!("{}", l.as_ref());
        self.text.push_str(l.as_ref());
        self.text.push('\n');
    }
}
