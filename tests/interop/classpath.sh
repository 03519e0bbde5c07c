#!/bin/sh
# Prints the Java classpath for the Curator peers in tests/interop/: Apache Curator
# 5.4 (recipes and curator-x-discovery, with Jackson) + ZooKeeper 3.8 client from
# Debian's /usr/share/java (packages libcurator-recipes-java,
# libcurator-discovery-java, zookeeper). slf4j-nop silences all logging.
# (Debian's guava.jar already bundles failureaccess.)
J=/usr/share/java
printf '%s\n' "$J/curator-recipes.jar:$J/curator-framework.jar:$J/curator-client.jar:$J/zookeeper.jar:$J/zookeeper-jute.jar:$J/guava.jar:$J/slf4j-api.jar:$J/slf4j-nop.jar:$J/curator-x-discovery.jar:$J/jackson-databind.jar:$J/jackson-core.jar:$J/jackson-annotations.jar"
