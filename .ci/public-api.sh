#!/usr/bin/env bash
# The crate's public API as text, one line per item and per method or impl, from rustdoc's
# HTML (stable rustdoc has no JSON output; perl is part of every Debian). `.ci/run`
# compares it with the committed `.ci/public-api.txt`, so that a change to the public API
# is deliberate: after one, run
#   bash .ci/public-api.sh > .ci/public-api.txt
# and commit the list with the change. Hidden items (`#[doc(hidden)]`) are not listed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

RUSTDOCFLAGS=-Dwarnings cargo doc --quiet --no-deps --all-features >/dev/null 2>&1 \
    || { echo "public-api: cargo doc failed" >&2; exit 1; }
cd "${CARGO_TARGET_DIR:-target}/doc/redlock_mux"
find . -name '*.html' \( -name 'struct.*' -o -name 'enum.*' -o -name 'trait.*' \
    -o -name 'fn.*' -o -name 'constant.*' -o -name 'type.*' -o -name 'macro.*' \) |
    LC_ALL=C sort |
    perl -e '
        while (my $page = <STDIN>) {
            chomp $page;
            open(my $fh, "<", $page) or die "$page: $!";
            local $/;
            my $html = <$fh>;
            close $fh;
            (my $item = $page) =~ s{^\./}{};
            $item =~ s{\.html$}{};
            # Only what the item itself says: not rustdoc'"'"'s auto-trait and blanket
            # impls (Send, Sync, From<T>, Any...).
            $html =~ s{<h2 id="synthetic-implementations".*}{}s;
            $html =~ s{<h2 id="blanket-implementations".*}{}s;
            my @parts;
            push @parts, $1 if $html =~ m{<pre class="rust item-decl">(.*?)</pre>}s;
            push @parts, $1 while $html =~ m{<h[34] class="code-header">(.*?)</h[34]>}sg;
            for my $p (@parts) {
                $p =~ s{<[^>]*>}{}g;
                $p =~ s{&lt;}{<}g; $p =~ s{&gt;}{>}g; $p =~ s{&quot;}{"}g;
                $p =~ s{&#39;}{'"'"'}g; $p =~ s{&amp;}{&}g;
                $p =~ s{\s+}{ }g; $p =~ s{^ | $}{}g;
                print "$item: $p\n";
            }
        }' |
    LC_ALL=C sort -u
