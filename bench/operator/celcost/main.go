// celcost: the TrainingJob CRD's CEL rules as kube-apiserver compiles and runs them (its own
// apiextensions-apiserver packages, the control plane's version): each rule's estimated cost (what
// the API server checks against its limits when the CRD is created) and the time to validate one
// object with that rule alone, then with every rule, as a create (no old object) does. The API
// server runs the same validation on every create and every status write of a TrainingJob.
//
// Usage: celcost CRD.yaml OBJECT.json [iterations]   (bench/operator/celcost.sh builds and runs it)
package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"sort"
	"time"

	apiextensions "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apivalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/model"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	kjson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"
)

func die(f string, a ...any) { fmt.Fprintf(os.Stderr, "celcost: "+f+"\n", a...); os.Exit(1) }

func readSchema(path string) *apiextensionsv1.JSONSchemaProps {
	raw, err := os.ReadFile(path)
	if err != nil {
		die("%v", err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		die("%s: %v", path, err)
	}
	return crd.Spec.Versions[0].Schema.OpenAPIV3Schema
}

// only keeps the rules for which keep(node path, rule) holds.
func only(p apiextensionsv1.JSONSchemaProps, path string, keep func(string, string) bool) apiextensionsv1.JSONSchemaProps {
	var rules apiextensionsv1.ValidationRules
	for _, r := range p.XValidations {
		if keep(path, r.Rule) {
			rules = append(rules, r)
		}
	}
	p.XValidations = rules
	if len(p.Properties) > 0 {
		props := make(map[string]apiextensionsv1.JSONSchemaProps, len(p.Properties))
		for k, v := range p.Properties {
			props[k] = only(v, path+"."+k, keep)
		}
		p.Properties = props
	}
	if p.Items != nil && p.Items.Schema != nil {
		s := only(*p.Items.Schema, path+"[*]", keep)
		p.Items = &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &s}
	}
	return p
}

func structural(props *apiextensionsv1.JSONSchemaProps) *structuralschema.Structural {
	var internal apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(props, &internal, nil); err != nil {
		die("%v", err)
	}
	ss, err := structuralschema.NewStructural(&internal)
	if err != nil {
		die("%v", err)
	}
	return ss
}

type rule struct {
	path, rule string
	cost       uint64
}

// estimates compiles every node's rules as the API server does at CRD creation.
func estimates(s *structuralschema.Structural, path string, root bool, out *[]rule) {
	if len(s.XValidations) > 0 {
		decl := model.SchemaDeclType(s, root)
		res, err := cel.Compile(s, decl, celconfig.PerCallLimit, environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion(), true), cel.NewExpressionsEnvLoader())
		if err != nil {
			die("%s: %v", path, err)
		}
		for i, r := range res {
			if r.Error != nil {
				die("%s: %v", path, r.Error)
			}
			*out = append(*out, rule{path, s.XValidations[i].Rule, r.MaxCost})
		}
	}
	keys := make([]string, 0, len(s.Properties))
	for k := range s.Properties {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p := s.Properties[k]
		estimates(&p, path+"."+k, false, out)
	}
	if s.Items != nil {
		estimates(s.Items, path+"[*]", false, out)
	}
}

func main() {
	if len(os.Args) < 3 {
		die("usage: celcost CRD.yaml OBJECT.json [iterations]")
	}
	props := readSchema(os.Args[1])
	ss := structural(props)
	raw, err := os.ReadFile(os.Args[2])
	if err != nil {
		die("%v", err)
	}
	n := 20000
	if len(os.Args) > 3 {
		fmt.Sscan(os.Args[3], &n)
	}
	var rules []rule
	estimates(ss, "", true, &rules)
	var total uint64
	var obj map[string]interface{}
	if err := kjson.Unmarshal(raw, &obj); err != nil {
		die("%s: %v", os.Args[2], err)
	}
	structuraldefaulting.Default(obj, ss)
	fmt.Printf("%-38s %9s %8s  %s\n", "node", "est. cost", "time µs", "rule")
	for _, r := range rules {
		total += r.cost
		text := r.rule
		if len(text) > 80 {
			text = text[:77] + "..."
		}
		one := func(path, rule string) bool { return path == r.path && rule == r.rule }
		d := timeValidation(structural(ptr(only(*props, "", one))), obj, n/4)
		fmt.Printf("%-38s %9d %8.2f  %s\n", r.path, r.cost, d, text)
	}
	fmt.Printf("%d rules, estimated cost %d in all (the API server refuses a rule estimated above %d, a CRD above %d)\n",
		len(rules), total, apivalidation.StaticEstimatedCostLimit, apivalidation.StaticEstimatedCRDCostLimit)

	if prof := os.Getenv("CELCOST_PROFILE"); prof != "" {
		f, _ := os.Create(prof)
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	fmt.Printf("validating one object (create, no old object), all rules: %.2f µs\n", timeValidation(ss, obj, n))
}

func ptr[T any](v T) *T { return &v }

// timeValidation: µs to validate obj as a create, best of 5 rounds of n.
func timeValidation(ss *structuralschema.Structural, obj map[string]interface{}, n int) float64 {
	v := cel.NewValidator(ss, true, celconfig.PerCallLimit)
	ctx := context.Background()
	if errs, _ := v.Validate(ctx, field.NewPath("root"), ss, obj, nil, celconfig.RuntimeCELCostBudget); len(errs) > 0 {
		die("the object is invalid: %v", errs.ToAggregate())
	}
	best := time.Duration(1 << 62)
	for round := 0; round < 5; round++ {
		t := time.Now()
		for i := 0; i < n; i++ {
			v.Validate(ctx, field.NewPath("root"), ss, obj, nil, celconfig.RuntimeCELCostBudget)
		}
		if d := time.Since(t) / time.Duration(n); d < best {
			best = d
		}
	}
	return float64(best.Nanoseconds()) / 1000
}
