package org.elasticsearch.plugins;

import org.elasticsearch.Build;

import java.util.Collections;

/** The descriptor of a class-path plugin: PluginDescriptor's constructor differs between 8.x and 9.x. */
final class ClasspathDescriptor {
    private ClasspathDescriptor() {}

    static PluginDescriptor of(Class<? extends Plugin> c) {
        return new PluginDescriptor(c.getName(), "classpath plugin", "NA", Build.current().version(),
            Integer.toString(Runtime.version().feature()), c.getName(), null, Collections.emptyList(),
            false, false, false, false, PluginDescriptor.DeploymentTarget.ALL);
    }
}
