//! `weir top`'s terminal screen: a [`View`] drawn with ratatui (a headline, then per pipeline
//! its headline and a table of its operators), and the key handling (q, Esc and Ctrl-C quit).

use ratatui::Frame;
use ratatui::crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Row, Table};

use super::model::{COLUMNS, RIGHT, View};

/// Draws `view` (and `problem`, the last failed refresh, if any) on the whole frame.
pub fn draw(frame: &mut Frame, view: Option<&View>, problem: Option<&str>) {
    let area = frame.area();
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut top = vec![Line::styled(
        "weir top  (q, Esc or Ctrl-C quits)".to_owned(),
        bold,
    )];
    if let Some(v) = view {
        top.push(Line::raw(v.headline()));
    }
    if let Some(p) = problem {
        top.push(Line::styled(
            p.to_owned(),
            Style::default().add_modifier(Modifier::REVERSED),
        ));
    }
    let Some(view) = view else {
        frame.render_widget(Paragraph::new(top), area);
        return;
    };
    let mut constraints = vec![Constraint::Length(top.len() as u16)];
    for p in &view.pipelines {
        constraints.push(Constraint::Length(1));
        constraints.push(Constraint::Length(p.operators.len() as u16 + 2));
    }
    constraints.push(Constraint::Min(0));
    let areas = Layout::vertical(constraints).split(area);
    frame.render_widget(Paragraph::new(top), areas[0]);
    let widths = column_widths(view);
    for (i, p) in view.pipelines.iter().enumerate() {
        let (head, body) = (areas[1 + 2 * i], areas[2 + 2 * i]);
        frame.render_widget(Paragraph::new(Line::styled(p.headline(), bold)), head);
        let header = Row::new(
            COLUMNS
                .iter()
                .zip(RIGHT)
                .map(|(c, right)| aligned(c, right)),
        )
        .style(bold);
        let rows = p.operators.iter().map(|o| {
            Row::new(
                o.cells()
                    .into_iter()
                    .zip(RIGHT)
                    .map(|(c, right)| aligned(&c, right)),
            )
        });
        let table = Table::new(rows, widths.iter().map(|&w| Constraint::Length(w)))
            .header(header)
            .column_spacing(2);
        frame.render_widget(table, indent(body));
    }
}

/// A cell, right-aligned for numbers.
fn aligned(text: &str, right: bool) -> Cell<'static> {
    let line = Line::raw(text.to_owned());
    Cell::from(if right { line.right_aligned() } else { line })
}

/// Every column as wide as its widest cell over all pipelines, so that tables line up.
fn column_widths(view: &View) -> Vec<u16> {
    let mut widths: Vec<u16> = COLUMNS.iter().map(|c| c.len() as u16).collect();
    for p in &view.pipelines {
        for o in &p.operators {
            for (w, c) in widths.iter_mut().zip(o.cells()) {
                *w = (*w).max(c.chars().count() as u16);
            }
        }
    }
    widths
}

fn indent(area: Rect) -> Rect {
    Rect {
        x: area.x.saturating_add(2),
        width: area.width.saturating_sub(2),
        ..area
    }
}

/// Whether `event` asks to quit: q, Esc, or Ctrl-C (raw mode delivers it as a key).
pub fn quits(event: &Event) -> bool {
    match event {
        Event::Key(KeyEvent {
            code,
            modifiers,
            kind,
            ..
        }) if *kind != KeyEventKind::Release => {
            matches!(code, KeyCode::Char('q') | KeyCode::Esc)
                || (*code == KeyCode::Char('c') && modifiers.contains(KeyModifiers::CONTROL))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    use ratatui::crossterm::event::KeyEventState;

    use super::super::model::tests::sample;
    use super::super::model::view;
    use super::*;

    fn screen(view: Option<&View>, problem: Option<&str>) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(110, 14)).expect("a test terminal");
        terminal.draw(|f| draw(f, view, problem)).expect("draws");
        let buffer = terminal.backend().buffer().clone();
        (0..buffer.area.height)
            .map(|y| {
                (0..buffer.area.width)
                    .map(|x| buffer[(x, y)].symbol().to_owned())
                    .collect::<String>()
                    .trim_end()
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn the_screen_shows_every_pipeline_and_operator() {
        let v = view(Some(&sample(10, 1_000)), &sample(12, 5_000));
        let lines = screen(Some(&v), None);
        assert_eq!(lines[0], "weir top  (q, Esc or Ctrl-C quits)");
        assert_eq!(lines[1], "file p.yaml  reloads 0  rates over 2.0 s");
        assert_eq!(
            lines[2],
            "pipeline p  running  restarts 1  checkpoint #4, 2.5 s ago, took 30 ms"
        );
        assert_eq!(
            lines[3],
            "  OPERATOR  TYPE    PAR  IN/s  OUT/s  ERRORS  ERR/s  BACKPRESSURE  BUSY  QUEUE  LAG"
        );
        assert_eq!(
            lines[5],
            "  tag       map       2  2.0k   2.0k      50   20.0          100%    0%    50%    -"
        );
        assert!(lines[6].starts_with("  out       sink"), "{lines:#?}");
    }

    #[test]
    fn a_failed_refresh_is_shown_above_the_last_view() {
        let v = view(None, &sample(10, 1_000));
        let lines = screen(Some(&v), Some("cannot reach weir run"));
        assert_eq!(lines[2], "cannot reach weir run");
        assert!(lines[3].starts_with("pipeline p"), "{lines:#?}");
        let lines = screen(None, Some("nothing yet"));
        assert_eq!(lines[1], "nothing yet");
    }

    #[test]
    fn q_esc_and_ctrl_c_quit() {
        let key = |code, modifiers| {
            Event::Key(KeyEvent {
                code,
                modifiers,
                kind: KeyEventKind::Press,
                state: KeyEventState::NONE,
            })
        };
        assert!(quits(&key(KeyCode::Char('q'), KeyModifiers::NONE)));
        assert!(quits(&key(KeyCode::Esc, KeyModifiers::NONE)));
        assert!(quits(&key(KeyCode::Char('c'), KeyModifiers::CONTROL)));
        assert!(!quits(&key(KeyCode::Char('c'), KeyModifiers::NONE)));
        assert!(!quits(&Event::Resize(80, 24)));
    }
}
