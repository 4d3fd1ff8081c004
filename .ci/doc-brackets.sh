#!/usr/bin/env bash
# After `cargo doc`: fail when the crate's rendered pages show an intra-doc link as literal
# text. rustdoc does not warn, even with -Dwarnings, of a link to a #[doc(hidden)] item: it
# prints `[MasterSpec::parse]` with its brackets (the docs' front page and Builder::masters
# did, issue 20). Code blocks and the blanket implementations (other crates' texts, e.g.
# tracing's `[Span]` under --no-deps) are not looked at.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

docs="${CARGO_TARGET_DIR:-target}/doc/redlock_mux"
[ -d "$docs" ] || { echo "error: no $docs: run cargo doc first" >&2; exit 1; }
found=$(find "$docs" -name '*.html' -print0 | xargs -0 perl -0777 -ne '
    s/id="blanket-implementations".*//s;
    s/<pre\b.*?<\/pre>//gs;
    # `[`Name`]` left as text:
    while (/(\[<code>[^<]*<\/code>\])/g) { print "$ARGV: $1\n" }
    # `[Name]` left as text, outside signatures and code spans:
    s/<(h\d) class="code-header">.*?<\/\1>//gs;
    s/<code>.*?<\/code>//gs;
    while (/(?<![;&\w])(\[[A-Z][A-Za-z0-9_]*(?:::[A-Za-z0-9_]+)*\])/g) { print "$ARGV: $1\n" }
    ')
if [ -n "$found" ]; then
    echo "error: links rendered as literal text (a link to a hidden or missing item):" >&2
    echo "$found" >&2
    exit 1
fi
echo "ok: no link rendered as literal text in $(find "$docs" -name '*.html' | wc -l) pages"
