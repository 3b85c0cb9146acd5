//go:build linux

package palisade

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The Go snippets of the main README and of this SDK's README, compiled
// as a user pastes them: each into a function (given `ctx` and the
// `client` the quick start made) of a scratch module that
// requires this package through a replace, as the README says to. A
// snippet that returns `err`/`nil` goes into a function returning error,
// the others into one returning nothing; every variable a snippet declares
// at its top level is then used (`_ = v`), since a snippet leaves its
// results to the reader. Blocks that are not statements (the import line,
// the list of signatures) are left out.
func TestTheReadmeSnippetsCompile(t *testing.T) {
	var funcs []string
	for _, readme := range []string{"../../README.md", "README.md"} {
		for i, block := range goBlocks(t, readme) {
			if strings.HasPrefix(block, "import") || strings.Contains(block, "\nfunc ") ||
				strings.HasPrefix(block, "func ") {
				continue
			}
			funcs = append(funcs, wrapSnippet(t, fmt.Sprintf("%s block %d", readme, i), block, len(funcs)))
		}
	}
	if len(funcs) < 3 {
		t.Fatalf("found %d Go snippets in the READMEs, expected at least 3", len(funcs))
	}
	dir := t.TempDir()
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	mod := "module readme\n\ngo 1.19\n\nrequire palisade.local/palisade v0.0.0\n\nreplace palisade.local/palisade => " + here + "\n"
	src := "package main\n\nimport (\n\t\"context\"\n\t\"errors\"\n\t\"log\"\n\t\"time\"\n\n\t\"palisade.local/palisade\"\n)\n\n" +
		"var (\n\t_ = errors.Is\n\t_ = log.Print\n\t_ = time.Second\n\t_ context.Context\n\t_ = palisade.NewClient\n)\n\nfunc main() {}\n\n" +
		strings.Join(funcs, "\n")
	for name, text := range map[string]string{"go.mod": mod, "main.go": src} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "build", "-o", os.DevNull, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the README snippets do not compile: %v\n%s\n--- main.go:\n%s", err, out, src)
	}
}

// goBlocks returns the bodies of the ```go blocks of path.
func goBlocks(t *testing.T, path string) []string {
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, part := range strings.Split(string(text), "```go\n")[1:] {
		if end := strings.Index(part, "```"); end >= 0 {
			blocks = append(blocks, strings.TrimSpace(part[:end]))
		}
	}
	return blocks
}

// wrapSnippet puts block into function number n, its top-level variables
// used at the end. It is given `ctx`, and the `client` unless it makes
// its own.
func wrapSnippet(t *testing.T, where, block string, n int) string {
	probe := "package p\nfunc f() {\n" + block + "\n}\n"
	file, err := parser.ParseFile(token.NewFileSet(), where, probe, 0)
	if err != nil {
		t.Fatalf("%s does not parse as statements: %v\n%s", where, err, block)
	}
	var declared []string
	for _, stmt := range file.Decls[0].(*ast.FuncDecl).Body.List {
		if assign, ok := stmt.(*ast.AssignStmt); ok && assign.Tok == token.DEFINE {
			for _, lhs := range assign.Lhs {
				if id, ok := lhs.(*ast.Ident); ok && id.Name != "_" {
					declared = append(declared, id.Name)
				}
			}
		}
	}
	params := "ctx context.Context, client *palisade.Client"
	body := block + "\n"
	for _, name := range declared {
		if name == "client" {
			params = "ctx context.Context"
		}
		body += "_ = " + name + "\n"
	}
	head := fmt.Sprintf("func snippet%d(%s)", n, params)
	tail := "\n}\n"
	if strings.Contains(block, "return err") || strings.Contains(block, "return nil") {
		head += " error"
		tail = "\n\treturn nil\n}\n"
	}
	return head + " {\n// " + where + "\n" + body + tail
}
