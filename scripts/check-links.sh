#!/usr/bin/env bash
# Check that every relative link in the repository's markdown resolves: the
# file or directory exists, and an anchor names a heading of the file it
# points into. Links to other sites are not fetched. With no arguments it
# checks every markdown file of the repository that git tracks or would;
# given paths, only those. It exits 1 when a link is broken.
#
#   bash scripts/check-links.sh
#   bash scripts/check-links.sh README.md docs/*.md
set -euo pipefail

if [ "$#" -eq 0 ]; then
	cd "$(dirname "$0")/.."
	mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.md')
else
	files=("$@")
fi

# anchors FILE prints the anchors GitHub makes of FILE's headings, one a
# line: lower case, punctuation dropped, each space a hyphen, and -1, -2
# after repeats. Headings inside fenced code are not headings.
anchors() {
	perl -CSD -ne '
		if (/^\s*(```|~~~)/) { $fence = !$fence; next }
		next if $fence;
		if (/<a\s+(?:name|id)="([^"]+)"/) { print "$1\n" }
		next unless /^#{1,6}\s+(.*?)\s*#*\s*$/;
		my $s = lc $1;
		$s =~ s/\[([^\]]*)\]\([^)]*\)/$1/g;  # a link in a heading keeps its text
		$s =~ s/[^\p{L}\p{N} _-]//g;
		$s =~ s/ /-/g;
		print $seen{$s}++ ? "$s-" . ($seen{$s} - 1) : $s, "\n";
	' "$1"
}

# links FILE prints "LINE TARGET" for each link in FILE outside code:
# inline [text](target) and reference definitions [label]: target.
links() {
	perl -CSD -ne '
		if (/^\s*(```|~~~)/) { $fence = !$fence; next }
		next if $fence;
		s/`[^`]*`//g;  # code spans hold no links
		print "$. $1\n" while /\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g;
		print "$. $1\n" if /^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$/;
	' "$1"
}

checked=0
broken=0
for file in "${files[@]}"; do
	dir=$(dirname "$file")
	while read -r line target; do
		case "$target" in
		[a-zA-Z]*:*) continue ;; # https:, mailto: and the like
		esac
		checked=$((checked + 1))
		path=${target%%#*}
		anchor=
		case "$target" in *'#'*) anchor=${target#*#} ;; esac
		if [ -z "$path" ]; then
			dest=$file
		else
			dest=$dir/$path
		fi
		if [ ! -e "$dest" ]; then
			echo "$file:$line: $target: no such file"
			broken=$((broken + 1))
			continue
		fi
		if [ -n "$anchor" ]; then
			case "$dest" in
			*.md)
				if ! anchors "$dest" | grep -qxF -- "$anchor"; then
					echo "$file:$line: $target: no heading makes #$anchor"
					broken=$((broken + 1))
				fi
				;;
			esac
		fi
	done < <(links "$file")
done

echo "checked $checked relative links in ${#files[@]} files: $broken broken"
[ "$broken" -eq 0 ]
