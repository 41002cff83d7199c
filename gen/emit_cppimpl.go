package gen

import (
	"fmt"
	"strings"
)

// A vtable with //kvcm:cppimpl gets, in the C++ declarations,
// detail::<CppName>Trampolines<Of>: one capture-less static function per
// slot (named as the slot), for a hand-written adapter to put in the vtable.
// Of::of(self) returns the C++ object whose method of the slot's name
// (lowerCamel) each calls; a C++ exception becomes the failure result 1.
// The parameters after self follow the conventions of //kvcm:gocaller (see
// callerArg), on the C++ side:
//
//   - const char* p, size_t pLen: a std::string_view (empty when pLen is 0);
//   - const T* p, size_t n: passed as they are;
//   - T* p, size_t capacity, size_t* needed: the method returns a container
//     of T; needed receives its size, and its elements are copied when they
//     fit;
//   - T* p: the method's result is written to it;
//   - a scalar: passed as it is.
//
// Slots tagged cpp:"-" are left to the adapter. Every other slot returns
// int32_t.
func cppImplSlots(d *Decl) []*Field {
	var out []*Field
	for _, f := range goImplSlots(d) {
		if f.Cpp != "-" {
			out = append(out, f)
		}
	}
	return out
}

// checkCppImpl checks that every slot cppimpl writes follows the conventions.
func checkCppImpl(d *Decl) error {
	for _, f := range cppImplSlots(d) {
		if _, _, err := callerArgs(f); err != nil {
			return fmt.Errorf("%s.%s (//kvcm:cppimpl): %w", d.GoName, f.GoName, err)
		}
		if r := f.Type.Sig.Result; r.Kind != KScalar || r.Scalar != "int32_t" {
			return fmt.Errorf("%s.%s (//kvcm:cppimpl): a trampoline returns int32_t: tag the slot cpp:\"-\"", d.GoName, f.GoName)
		}
	}
	return nil
}

// cppTrampolines writes detail::<CppName>Trampolines.
func cppTrampolines(b *strings.Builder, d *Decl) {
	name := d.CppName + "Trampolines"
	fmt.Fprintf(b, "// %s<Of> are the slots of %s that call the methods of\n", name, d.CppName)
	fmt.Fprintf(b, "// Of::of(self) (generated from //kvcm:cppimpl); a C++ exception becomes the failure result 1.\n")
	fmt.Fprintf(b, "template <typename Of>\nstruct %s {\n", name)
	for i, f := range cppImplSlots(d) {
		if i > 0 {
			b.WriteString("\n")
		}
		params, results, _ := callerArgs(f)
		var args []string
		for _, a := range params {
			p := a.param
			switch a.kind {
			case "string":
				args = append(args, fmt.Sprintf("%s == 0 ? std::string_view() : std::string_view(%s, %s)", p.Len, p.CName, p.Len))
			case "slice":
				next := f.Type.Sig.Params[slotIndex(f, p)+1]
				args = append(args, p.CName, next.CName)
			default:
				args = append(args, p.CName)
			}
		}
		call := fmt.Sprintf("Of::of(self).%s(%s)", lowerCamel(Snake(f.GoName)), strings.Join(args, ", "))
		fmt.Fprintf(b, "    static %s %s(%s) noexcept {\n        try {\n", f.Type.Sig.Result.CName(), f.CName, f.Type.Sig.CParams())
		switch {
		case len(results) == 1 && results[0].kind == "buffer":
			i := slotIndex(f, results[0].param)
			ps := f.Type.Sig.Params
			fmt.Fprintf(b, "            auto const r = %s;\n", call)
			fmt.Fprintf(b, "            *%s = r.size();\n", ps[i+2].CName)
			fmt.Fprintf(b, "            if (r.size() <= %s && !r.empty()) {\n                std::copy(r.begin(), r.end(), %s);\n            }\n", ps[i+1].CName, ps[i].CName)
		case len(results) == 1:
			fmt.Fprintf(b, "            *%s = %s;\n", results[0].param.CName, call)
		default:
			fmt.Fprintf(b, "            %s;\n", call)
		}
		b.WriteString("            return 0;\n        } catch (...) {\n            return 1;\n        }\n    }\n")
	}
	b.WriteString("};\n\n")
}

// slotIndex is the position of p among the slot's parameters.
func slotIndex(f *Field, p *Param) int {
	for i, q := range f.Type.Sig.Params {
		if q == p {
			return i
		}
	}
	return -1
}
