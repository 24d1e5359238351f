// psa-check evaluates every pod, and every pod template of a Deployment, in YAML streams against the
// `restricted` Pod Security Standard (latest version) with the pod-security-admission library, the code
// the API server's PodSecurity admission runs. It prints one line per pod and exits 1 if any is refused.
// Usage (hack/audit.sh builds and runs it): psa-check FILE...
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
)

type pod struct {
	name string
	meta *metav1.ObjectMeta
	spec *corev1.PodSpec
}

// podsIn returns the pods of one YAML stream: Pods as they are, Deployments by their pod template.
func podsIn(path string) ([]pod, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var pods []pod
	reader := utilyaml.NewYAMLReader(bufio.NewReader(f))
	for {
		var raw metav1.TypeMeta
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return pods, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if utilyaml.Unmarshal(doc, &raw) != nil {
			continue
		}
		switch raw.Kind {
		case "Pod":
			var p corev1.Pod
			if err := utilyaml.Unmarshal(doc, &p); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			pods = append(pods, pod{"Pod/" + p.Name, &p.ObjectMeta, &p.Spec})
		case "Deployment":
			var d appsv1.Deployment
			if err := utilyaml.Unmarshal(doc, &d); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			pods = append(pods, pod{"Deployment/" + d.Name, &d.Spec.Template.ObjectMeta, &d.Spec.Template.Spec})
		}
	}
}

func main() {
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	restricted := api.LevelVersion{Level: api.LevelRestricted, Version: api.LatestVersion()}
	refused := 0
	for _, path := range os.Args[1:] {
		pods, err := podsIn(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		for _, p := range pods {
			result := policy.AggregateCheckResults(evaluator.EvaluatePod(restricted, p.meta, p.spec))
			if result.Allowed {
				fmt.Printf("admitted  %s (%s)\n", p.name, path)
			} else {
				refused++
				fmt.Printf("REFUSED   %s (%s): %s: %s\n", p.name, path, result.ForbiddenReason(), result.ForbiddenDetail())
			}
		}
	}
	if refused > 0 {
		os.Exit(1)
	}
}
